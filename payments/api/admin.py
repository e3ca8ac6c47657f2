"""Admin face (`ak_` staff keys): parties, keys, adjustments and their approvals, freezes,
fee schedules.
Routed by config/api_urls.py. Each action needs the permission its back-office twin
needs (`action_permissions`), checked against the staff member's login at each request."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import AdminViewSet
from apikit.viewsets import CreateMixin, ListMixin, RetrieveMixin, object_action
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.models import Adjustment, FeeSchedule, PendingAdjustment
from payments.services import approvals, fees, freezes
from wallets import selectors as wallet_selectors
from wallets.books import account_balance_lines_at
from wallets.contacts import customer_contact_attach, customers_contact_attach, customers_find_by_email
from wallets.models import ApiKey, Customer, Merchant, Store, Terminal
from wallets.services import contacts as contact_services
from wallets.services import principals as party_services

TAG = ["admin"]


def _permissions(view: str, **actions: str) -> dict[str, str]:
    """Reads need the model's view permission; `actions` name what each write needs."""
    return {"list": view, "retrieve": view, "metadata": view, **actions}


def _customer(view: AdminViewSet, customer_id: str) -> Customer:
    """The customer an action acts on (its contact is read only for the answer)."""
    return wallet_selectors.customer_get(customer_id=customer_id)


BALANCES_AT = ("Each asset the account holds now or held then, its `balance` as of `at`: the ledger's entries created at or before"
               " it. Before the account existed every balance is 0. A malformed `at`, one without an offset, or one in the future: 400.")


def _balances_at(view: AdminViewSet, account_id: str) -> Response:
    at = view.query(s.BalanceAtParams).get("at") or timezone.now()
    return view.render(s.PartyBalancesAtOut, {"account": account_id, "at": at, "balances": account_balance_lines_at(account_id=account_id, at=at)})


class CustomerViewSet(ListMixin, CreateMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "customer_id"
    action_permissions = _permissions(
        "wallets.view_customer", create="wallets.add_customer", freeze="wallets.freeze_account",
        unfreeze="wallets.freeze_account", contact="wallets.change_customer", balances="wallets.view_customer",
    )
    out, list_params, create_in = s.CustomerOut, s.CustomerListParams, s.CustomerCreateIn
    summaries = {"list": "List customers (optionally by email)", "create": "Create a customer (and their wallet)", "retrieve": "Retrieve a customer"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Customer]:
        return customers_find_by_email(email=params["email"]) if params.get("email") else wallet_selectors.customer_list()

    def page_complete(self, rows: list[Any]) -> list[Any]:
        return customers_contact_attach(customers=rows)

    def object_create(self, data: dict[str, Any]) -> Customer:
        customer = party_services.customer_create(name=data["name"], email=data["email"], phone=data["phone"])
        return customer_contact_attach(customer=customer)

    def object_get(self, customer_id: str) -> Customer:
        return customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=customer_id))

    @object_action(
        TAG, summary="Freeze a customer's wallet (payments, transfers, refunds, top-ups refused)", body=s.FreezeIn, out=s.CustomerOut,
        target=_customer,
    )
    def freeze(self, customer: Customer, data: dict[str, Any]) -> Customer:
        freezes.wallet_freeze(customer=customer, staff=self.staff, reason=data["reason"])
        return self.object_get(customer.pk)

    @object_action(TAG, summary="Lift a freeze", body=s.UnfreezeIn, out=s.CustomerOut, target=_customer)
    def unfreeze(self, customer: Customer, data: dict[str, Any]) -> Customer:
        freezes.wallet_unfreeze(customer=customer, staff=self.staff, reason=data["reason"])
        return self.object_get(customer.pk)

    @object_action(
        TAG, summary="Set, clear or keep a customer's email and phone (a field left out is unchanged; null clears it)",
        body=s.ContactUpdateIn, out=s.CustomerOut, target=_customer,
    )
    def contact(self, customer: Customer, data: dict[str, Any]) -> Customer:
        contact_services.customer_contact_update(customer_id=customer.pk, **data)
        return self.object_get(customer.pk)

    @extend_schema(tags=TAG, summary="A customer's balance per asset as of an instant (`at`, default now), from the ledger",
                   description=BALANCES_AT, parameters=[s.BalanceAtParams], responses=s.PartyBalancesAtOut)
    @action(detail=True, methods=["get"])
    def balances(self, request: Request, customer_id: str) -> Response:
        return _balances_at(self, wallet_selectors.customer_get(customer_id=customer_id).account.pk)


class MerchantViewSet(ListMixin, CreateMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "merchant_id"
    action_permissions = _permissions("wallets.view_merchant", create="wallets.add_merchant", balances="wallets.view_merchant")
    out, create_in = s.MerchantOut, s.MerchantCreateIn
    summaries = {"list": "List merchants", "create": "Create a merchant", "retrieve": "Retrieve a merchant"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Merchant]:
        return wallet_selectors.merchant_list()

    def object_create(self, data: dict[str, Any]) -> Merchant:
        return party_services.merchant_create(name=data["name"])

    def object_get(self, merchant_id: str) -> Merchant:
        return wallet_selectors.merchant_get(merchant_id=merchant_id)

    @extend_schema(tags=TAG, summary="A merchant's balance per asset as of an instant (`at`, default now), from the ledger",
                   description=BALANCES_AT, parameters=[s.BalanceAtParams], responses=s.PartyBalancesAtOut)
    @action(detail=True, methods=["get"])
    def balances(self, request: Request, merchant_id: str) -> Response:
        return _balances_at(self, wallet_selectors.merchant_get(merchant_id=merchant_id).account.pk)


class StoreViewSet(ListMixin, CreateMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "store_id"
    action_permissions = _permissions("wallets.view_store", create="wallets.add_store")
    out, create_in = s.StoreOut, s.StoreCreateIn
    summaries = {"list": "List stores", "create": "Create a store of a merchant", "retrieve": "Retrieve a store"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Store]:
        return wallet_selectors.store_list()

    def object_create(self, data: dict[str, Any]) -> Store:
        merchant = wallet_selectors.merchant_get(merchant_id=data["merchant"], param="merchant")
        return party_services.store_create(merchant=merchant, name=data["name"])

    def object_get(self, store_id: str) -> Store:
        return wallet_selectors.store_get(store_id=store_id)


class TerminalViewSet(ListMixin, CreateMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "terminal_id"
    action_permissions = _permissions("wallets.view_terminal", create="wallets.add_terminal")
    out, create_in = s.TerminalOut, s.TerminalCreateIn
    summaries = {"list": "List terminals", "create": "Create a terminal in a store", "retrieve": "Retrieve a terminal"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Terminal]:
        return wallet_selectors.terminal_list()

    def object_create(self, data: dict[str, Any]) -> Terminal:
        store = wallet_selectors.store_get(store_id=data["store"], param="store")
        return party_services.terminal_create(store=store, name=data["name"])

    def object_get(self, terminal_id: str) -> Terminal:
        return wallet_selectors.terminal_get(terminal_id=terminal_id)


class ApiKeyViewSet(ListMixin, CreateMixin, RetrieveMixin, AdminViewSet):
    # create and rotate answer a secret shown once: the idempotency layer seals the stored
    # body of every POST of this viewset (revoke's too, which is harmless: replays unseal).
    idempotency_response_contains_secret = True
    lookup_url_kwarg = "api_key_id"
    # Minting and rotating are their own permission; the service also refuses a staff
    # member's key to a login holding less than that member (wallets.services.principals).
    action_permissions = _permissions(
        "wallets.view_apikey", create="wallets.issue_apikey", rotate="wallets.issue_apikey", revoke="wallets.manage_apikey"
    )
    out, list_params, create_in, create_out = s.ApiKeyOut, s.ApiKeyListParams, s.ApiKeyCreateIn, s.ApiKeyCreatedOut
    summaries = {
        "list": "List API keys (never the secrets)",
        "create": "Create an API key for a principal (the key is shown once; a staff member's key only by a login holding"
        " every permission that member holds)",
        "retrieve": "Retrieve an API key",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[ApiKey]:
        return wallet_selectors.api_key_list(principal_type=params.get("principal_type"), principal_id=params.get("principal_id"))

    def object_create(self, data: dict[str, Any]) -> ApiKey:
        principal = wallet_selectors.principal_get(principal_type=data["principal_type"], principal_id=data["principal_id"])
        api_key, raw_key = party_services.api_key_issue(issuer=self.staff_login, principal=principal)
        return _with_key(api_key, raw_key)

    def object_get(self, api_key_id: str) -> ApiKey:
        return wallet_selectors.api_key_get(api_key_id=api_key_id)

    @object_action(
        TAG, summary="Rotate a key: a new key now, the old one keeps working for the overlap window", body=s.ApiKeyRotateIn,
        out=s.ApiKeyRotatedOut, status=201,
    )
    def rotate(self, old: ApiKey, data: dict[str, Any]) -> ApiKey:
        new_key, raw_key = party_services.api_key_rotate(api_key=old, issuer=self.staff_login, overlap=timedelta(seconds=data["overlap_seconds"]))
        return _with_key(new_key, raw_key, replaces=old)

    @object_action(TAG, summary="Revoke a key now", body=s.EmptyIn, out=s.ApiKeyOut)
    def revoke(self, api_key: ApiKey, data: dict[str, Any]) -> ApiKey:
        return party_services.api_key_revoke(api_key=api_key)


def _with_key(api_key: ApiKey, raw_key: str, **extra: Any) -> ApiKey:
    # The raw key lives only in this response: it is never stored, logged or cached.
    for name, value in {"key": raw_key, **extra}.items():
        setattr(api_key, name, value)
    return api_key


class AdjustmentViewSet(ListMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "adjustment_id"
    action_permissions = _permissions("payments.view_adjustment", create="payments.add_pendingadjustment")
    out = s.AdjustmentOut
    summaries = {"list": "List adjustments", "retrieve": "Retrieve an adjustment"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Adjustment]:
        return payment_selectors.adjustments_list()

    def object_get(self, adjustment_id: str) -> Adjustment:
        return payment_selectors.adjustment_get(adjustment_id=adjustment_id)

    @extend_schema(
        tags=TAG,
        summary="Credit or debit a customer or merchant, with a reason (audited). Posted (201) while what this staff member"
        " posted alone in this asset within the tenant's window, to every party together, stays within its approval threshold;"
        " otherwise held (202) until a second staff member approves it",
        request=s.AdjustmentCreateIn, responses={201: s.AdjustmentOut, 202: s.PendingAdjustmentOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.AdjustmentCreateIn)
        customer = wallet_selectors.customer_get(customer_id=data["customer"], param="customer") if data.get("customer") else None
        merchant = wallet_selectors.merchant_get(merchant_id=data["merchant"], param="merchant") if data.get("merchant") else None
        result = approvals.adjustment_request(
            maker=self.staff, customer=customer, merchant=merchant, asset_code=data["asset"], amount=data["amount"],
            direction=data["direction"], reason=data["reason"],
        )
        if isinstance(result, PendingAdjustment):
            return self.render(s.PendingAdjustmentOut, result, status=202)
        return self.render(s.AdjustmentOut, result, status=201)


class PendingAdjustmentViewSet(ListMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "pending_adjustment_id"
    action_permissions = _permissions(
        "payments.view_pendingadjustment", approve="payments.approve_pendingadjustment", reject="payments.approve_pendingadjustment"
    )
    out, list_params = s.PendingAdjustmentOut, s.PendingAdjustmentListParams
    summaries = {"list": "List adjustments held for a second staff member's approval", "retrieve": "Retrieve a held adjustment"}

    def objects(self, params: dict[str, Any]) -> QuerySet[PendingAdjustment]:
        return payment_selectors.pending_adjustments_list(status=params.get("status"))

    def object_get(self, pending_adjustment_id: str) -> PendingAdjustment:
        return payment_selectors.pending_adjustment_get(pending_id=pending_adjustment_id)

    @object_action(
        TAG, summary="Approve and post another staff member's held adjustment (never your own)", body=s.EmptyIn,
        out=s.PendingAdjustmentOut,
    )
    def approve(self, pending: PendingAdjustment, data: dict[str, Any]) -> PendingAdjustment:
        approvals.pending_adjustment_approve(pending=pending, checker=self.staff)
        return self.object_get(pending.pk)

    @object_action(
        TAG, summary="Reject another staff member's held adjustment (nothing is posted)", body=s.PendingAdjustmentRejectIn,
        out=s.PendingAdjustmentOut,
    )
    def reject(self, pending: PendingAdjustment, data: dict[str, Any]) -> PendingAdjustment:
        return approvals.pending_adjustment_reject(pending=pending, checker=self.staff, reason=data["reason"])


class FeeScheduleViewSet(ListMixin, CreateMixin, RetrieveMixin, AdminViewSet):
    lookup_url_kwarg = "fee_schedule_id"
    action_permissions = _permissions("payments.view_feeschedule", create="payments.add_feeschedule")
    out, create_in = s.FeeScheduleOut, s.FeeScheduleCreateIn
    summaries = {
        "list": "List fee schedules, newest first",
        "create": "Add a fee schedule for an asset, tenant-wide or a merchant's own (which beats the tenant-wide one), from valid_from on;"
        " a schedule is never edited: add a new one",
        "retrieve": "Retrieve a fee schedule",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[FeeSchedule]:
        return payment_selectors.fee_schedules_list()

    def object_create(self, data: dict[str, Any]) -> FeeSchedule:
        merchant = wallet_selectors.merchant_get(merchant_id=data["merchant"], param="merchant") if data["merchant"] else None
        return fees.fee_schedule_create(
            asset_code=data["asset"], merchant=merchant, rate=data["rate"], rounding=data["rounding"], fixed=data["fixed"],
            valid_from=data["valid_from"],
        )

    def object_get(self, fee_schedule_id: str) -> FeeSchedule:
        return payment_selectors.fee_schedule_get(fee_schedule_id=fee_schedule_id)
