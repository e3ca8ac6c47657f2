"""factory-boy factories for a tenant's parties. Parties go through the same services as
production (accounts are created with them); money only ever through payments.services."""

from __future__ import annotations

import itertools
from typing import Any

import factory

from payments.models import AdjustmentDirection
from payments.services.adjustments import adjustment_create
from wallets.models import Customer, Merchant, StaffMember, Store, Terminal
from wallets.services.principals import customer_create, merchant_create, staff_member_get_or_create, store_create, terminal_create

_seq = itertools.count()


class CustomerFactory(factory.Factory):
    class Meta:
        model = Customer

    name = factory.Sequence(lambda n: f"Customer {n}")
    email = ""

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Customer:
        return customer_create(name=kwargs["name"], email=kwargs.get("email", ""))


class MerchantFactory(factory.Factory):
    class Meta:
        model = Merchant

    name = factory.Sequence(lambda n: f"Merchant {n}")

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Merchant:
        return merchant_create(name=kwargs["name"])


class StoreFactory(factory.Factory):
    class Meta:
        model = Store

    merchant = factory.SubFactory(MerchantFactory)
    name = factory.Sequence(lambda n: f"Store {n}")

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Store:
        return store_create(merchant=kwargs["merchant"], name=kwargs["name"])


class TerminalFactory(factory.Factory):
    class Meta:
        model = Terminal

    store = factory.SubFactory(StoreFactory)
    name = factory.Sequence(lambda n: f"Till {n}")

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Terminal:
        return terminal_create(store=kwargs["store"], name=kwargs["name"])


def staff() -> StaffMember:
    return staff_member_get_or_create(username="factory-staff")


def fund(customer: Customer | None = None, amount: int = 0, *, asset: str = "JPY", merchant: Merchant | None = None) -> None:
    """Credit a wallet through a staff adjustment (a real, balanced ledger movement)."""
    adjustment_create(
        staff=staff(), customer=customer, merchant=merchant, asset_code=asset, amount=amount,
        direction=AdjustmentDirection.CREDIT, reason=f"test funding {next(_seq)}",
    )
