"""SPEC 4: a terminal or merchant charges a customer by the customer's payment token (the
QR). By bare customer id only where the tenant allows it, or with the customer's mandate
for that merchant, which the customer grants and revokes from the customer face."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from payments.errors import ChargeByCustomerIdNotPermitted
from payments.models import Payment
from payments.services.charges import payment_create
from payments.services.intents import payment_intent_create
from payments.services.mandates import mandate_grant, mandate_revoke
from tenants.models import Tenant
from tests.api.conftest import Api, World, error_of
from tests.factories import fund


@pytest.fixture
def token_only(tenant: Tenant) -> Iterator[Tenant]:
    """The default: no charging by customer id (the test tenants allow it otherwise)."""
    tenant.charge_by_customer_id = False
    tenant.save(update_fields=["charge_by_customer_id"])  # the row: rolled back with the test
    connection.set_tenant(tenant)
    yield tenant
    tenant.charge_by_customer_id = True  # the session's shared object: as the other tests expect it


def _pay(api: Api, world: World, amount: int = 100) -> Any:
    return api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": amount})


def test_by_default_a_terminal_charges_by_token_only(api: Api, world: World, token_only: Tenant) -> None:
    fund(world.customer.obj, 1_000)
    refused = _pay(api, world)
    assert refused.status_code == 403, refused.content
    assert error_of(refused)["code"] == "charge_by_customer_id_not_permitted" and error_of(refused)["param"] == "customer"
    # An id that does not exist is refused the same way: the refusal says nothing about existence.
    unknown = api.post("/v1/terminal/payments", world.terminal.key, {"customer": "cus_doesnotexist", "asset": "JPY", "amount": 1})
    assert unknown.status_code == 403
    token = api.post("/v1/customer/payment_tokens", world.customer.key, {}).json()["token"]
    paid = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": token, "asset": "JPY", "amount": 100})
    assert paid.status_code == 201, paid.content
    assert Payment.objects.filter(customer_id=world.customer.id).count() == 1


def test_a_mandate_lets_its_merchant_charge_by_id_until_revoked(api: Api, world: World, token_only: Tenant) -> None:
    fund(world.customer.obj, 1_000)
    granted = api.post("/v1/customer/mandates", world.customer.key, {"merchant": world.merchant.id})
    assert granted.status_code == 201, granted.content
    mandate = granted.json()
    assert (mandate["object"], mandate["merchant"], mandate["revoked_at"]) == ("mandate", world.merchant.id, None)
    assert _pay(api, world).status_code == 201
    # Another merchant's terminal is not covered by this merchant's mandate.
    other = api.post("/v1/terminal/payments", world.terminal2.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1})
    assert other.status_code == 403
    listed = api.get("/v1/customer/mandates", world.customer.key).json()["data"]
    assert [m["id"] for m in listed] == [mandate["id"]]
    revoked = api.post(f"/v1/customer/mandates/{mandate['id']}/revoke", world.customer.key, {})
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert _pay(api, world).status_code == 403
    # Another customer cannot see or revoke it.
    assert api.get(f"/v1/customer/mandates/{mandate['id']}", world.customer2.key).status_code == 404


def test_the_services_apply_the_same_rule_to_intents(world: World, token_only: Tenant) -> None:
    customer, merchant, terminal = world.customer.obj, world.merchant.obj, world.terminal.obj
    fund(customer, 1_000)
    with pytest.raises(ChargeByCustomerIdNotPermitted):
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1)
    with pytest.raises(ChargeByCustomerIdNotPermitted):
        payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=10)
    mandate = mandate_grant(customer=customer, merchant=merchant)
    assert mandate_grant(customer=customer, merchant=merchant).pk == mandate.pk  # one active mandate per pair
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=10)
    mandate_revoke(mandate=mandate)
    from payments.services.intents import payment_intent_confirm

    with pytest.raises(ChargeByCustomerIdNotPermitted):
        payment_intent_confirm(intent=intent)  # revoked before the charge: refused


def test_a_merchant_cannot_tell_whether_a_customer_id_exists(api: Api, world: World, token_only: Tenant) -> None:
    for customer in (world.customer.id, "cus_doesnotexist"):
        r = api.post("/v1/merchant/payment_intents", world.merchant.key, {"customer": customer, "asset": "JPY", "amount": 10})
        assert r.status_code == 403 and error_of(r)["code"] == "charge_by_customer_id_not_permitted", r.content


def test_two_grants_at_once_give_one_mandate(live_tenant: Tenant) -> None:
    import threading

    from payments.models import Mandate
    from tests.conftest import run_in_thread_tenant
    from tests.factories import CustomerFactory, MerchantFactory

    customer, merchant = CustomerFactory(), MerchantFactory()
    barrier, granted, errors = threading.Barrier(4), [], []

    def grant() -> None:
        def body() -> None:
            barrier.wait()
            granted.append(mandate_grant(customer=customer, merchant=merchant).pk)

        try:
            run_in_thread_tenant(live_tenant, body)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=grant) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and len(set(granted)) == 1 and len(granted) == 4
    assert Mandate.objects.filter(customer=customer, merchant=merchant).count() == 1
