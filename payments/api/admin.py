"""Admin face (`ak_` staff keys): parties, keys, adjustments and their approvals, freezes.
Routed by config/api_urls.py. Each action needs the permission its back-office twin
needs (`action_permissions`), checked against the staff member's login at each request."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import AdminViewSet
from apikit.pagination import ListParamsSerializer
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.models import PendingAdjustment
from payments.services import approvals, freezes
from wallets import selectors as wallet_selectors
from wallets.contacts import customer_contact_attach, customers_contact_attach, customers_find_by_email
from wallets.services import contacts as contact_services
from wallets.services import principals as party_services

TAG = ["admin"]


def _permissions(view: str, **actions: str) -> dict[str, str]:
    """Reads need the model's view permission; `actions` name what each write needs."""
    return {"list": view, "retrieve": view, "metadata": view, **actions}


class CustomerViewSet(AdminViewSet):
    lookup_url_kwarg = "customer_id"
    action_permissions = _permissions(
        "wallets.view_customer", create="wallets.add_customer", freeze="wallets.freeze_account",
        unfreeze="wallets.freeze_account", contact="wallets.change_customer",
    )

    @extend_schema(tags=TAG, summary="List customers (optionally by email)", parameters=[s.CustomerListParams], responses=s.CustomerList)
    def list(self, request: Request) -> Response:
        params = self.query(s.CustomerListParams)
        customers = customers_find_by_email(email=params["email"]) if params.get("email") else wallet_selectors.customer_list()
        return self.list_response(customers, s.CustomerOut, params, prepare=lambda rows: customers_contact_attach(customers=rows))

    @extend_schema(tags=TAG, summary="Create a customer (and their wallet)", request=s.CustomerCreateIn, responses={201: s.CustomerOut})
    def create(self, request: Request) -> Response:
        data = self.validated(s.CustomerCreateIn)
        customer = party_services.customer_create(name=data["name"], email=data["email"], phone=data["phone"])
        return self.render(s.CustomerOut, customer_contact_attach(customer=customer), status=201)

    @extend_schema(tags=TAG, summary="Retrieve a customer", responses=s.CustomerOut)
    def retrieve(self, request: Request, customer_id: str) -> Response:
        return self.render(s.CustomerOut, customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=customer_id)))

    @extend_schema(
        tags=TAG, summary="Freeze a customer's wallet (payments, transfers, refunds, top-ups refused)", request=s.FreezeIn,
        responses={200: s.CustomerOut},
    )
    @action(detail=True, methods=["post"])
    def freeze(self, request: Request, customer_id: str) -> Response:
        customer = wallet_selectors.customer_get(customer_id=customer_id)
        data = self.validated(s.FreezeIn)
        freezes.wallet_freeze(customer=customer, staff=self.staff, reason=data["reason"])
        return self.render(s.CustomerOut, customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=customer_id)))

    @extend_schema(tags=TAG, summary="Lift a freeze", request=s.UnfreezeIn, responses={200: s.CustomerOut})
    @action(detail=True, methods=["post"])
    def unfreeze(self, request: Request, customer_id: str) -> Response:
        customer = wallet_selectors.customer_get(customer_id=customer_id)
        data = self.validated(s.UnfreezeIn)
        freezes.wallet_unfreeze(customer=customer, staff=self.staff, reason=data["reason"])
        return self.render(s.CustomerOut, customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=customer_id)))

    @extend_schema(
        tags=TAG, summary="Set, clear or keep a customer's email and phone (a field left out is unchanged; null clears it)",
        request=s.ContactUpdateIn, responses={200: s.CustomerOut},
    )
    @action(detail=True, methods=["post"])
    def contact(self, request: Request, customer_id: str) -> Response:
        customer = wallet_selectors.customer_get(customer_id=customer_id)
        data = self.validated(s.ContactUpdateIn)
        contact_services.customer_contact_update(customer_id=customer.pk, **data)
        return self.render(s.CustomerOut, customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=customer_id)))


class MerchantViewSet(AdminViewSet):
    lookup_url_kwarg = "merchant_id"
    action_permissions = _permissions("wallets.view_merchant", create="wallets.add_merchant")

    @extend_schema(tags=TAG, summary="List merchants", parameters=[ListParamsSerializer], responses=s.MerchantList)
    def list(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.merchant_list(), s.MerchantOut, self.query(ListParamsSerializer))

    @extend_schema(tags=TAG, summary="Create a merchant", request=s.MerchantCreateIn, responses={201: s.MerchantOut})
    def create(self, request: Request) -> Response:
        data = self.validated(s.MerchantCreateIn)
        return self.render(s.MerchantOut, party_services.merchant_create(name=data["name"]), status=201)

    @extend_schema(tags=TAG, summary="Retrieve a merchant", responses=s.MerchantOut)
    def retrieve(self, request: Request, merchant_id: str) -> Response:
        return self.render(s.MerchantOut, wallet_selectors.merchant_get(merchant_id=merchant_id))


class StoreViewSet(AdminViewSet):
    lookup_url_kwarg = "store_id"
    action_permissions = _permissions("wallets.view_store", create="wallets.add_store")

    @extend_schema(tags=TAG, summary="List stores", parameters=[ListParamsSerializer], responses=s.StoreList)
    def list(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.store_list(), s.StoreOut, self.query(ListParamsSerializer))

    @extend_schema(tags=TAG, summary="Create a store of a merchant", request=s.StoreCreateIn, responses={201: s.StoreOut})
    def create(self, request: Request) -> Response:
        data = self.validated(s.StoreCreateIn)
        merchant = wallet_selectors.merchant_get(merchant_id=data["merchant"], param="merchant")
        return self.render(s.StoreOut, party_services.store_create(merchant=merchant, name=data["name"]), status=201)

    @extend_schema(tags=TAG, summary="Retrieve a store", responses=s.StoreOut)
    def retrieve(self, request: Request, store_id: str) -> Response:
        return self.render(s.StoreOut, wallet_selectors.store_get(store_id=store_id))


class TerminalViewSet(AdminViewSet):
    lookup_url_kwarg = "terminal_id"
    action_permissions = _permissions("wallets.view_terminal", create="wallets.add_terminal")

    @extend_schema(tags=TAG, summary="List terminals", parameters=[ListParamsSerializer], responses=s.TerminalList)
    def list(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.terminal_list(), s.TerminalOut, self.query(ListParamsSerializer))

    @extend_schema(tags=TAG, summary="Create a terminal in a store", request=s.TerminalCreateIn, responses={201: s.TerminalOut})
    def create(self, request: Request) -> Response:
        data = self.validated(s.TerminalCreateIn)
        store = wallet_selectors.store_get(store_id=data["store"], param="store")
        return self.render(s.TerminalOut, party_services.terminal_create(store=store, name=data["name"]), status=201)

    @extend_schema(tags=TAG, summary="Retrieve a terminal", responses=s.TerminalOut)
    def retrieve(self, request: Request, terminal_id: str) -> Response:
        return self.render(s.TerminalOut, wallet_selectors.terminal_get(terminal_id=terminal_id))


class ApiKeyViewSet(AdminViewSet):
    # create and rotate answer a secret shown once: the idempotency layer seals the stored
    # body of every POST of this viewset (revoke's too, which is harmless: replays unseal).
    idempotency_response_contains_secret = True
    lookup_url_kwarg = "api_key_id"
    # Minting and rotating are their own permission; the service also refuses a staff
    # member's key to a login holding less than that member (wallets.services.principals).
    action_permissions = _permissions(
        "wallets.view_apikey", create="wallets.issue_apikey", rotate="wallets.issue_apikey", revoke="wallets.manage_apikey"
    )

    @extend_schema(tags=TAG, summary="List API keys (never the secrets)", parameters=[s.ApiKeyListParams], responses=s.ApiKeyList)
    def list(self, request: Request) -> Response:
        params = self.query(s.ApiKeyListParams)
        keys = wallet_selectors.api_key_list(principal_type=params.get("principal_type"), principal_id=params.get("principal_id"))
        return self.list_response(keys, s.ApiKeyOut, params)

    @extend_schema(
        tags=TAG, summary="Create an API key for a principal (the key is shown once; a staff member's key only by a login holding"
        " every permission that member holds)", request=s.ApiKeyCreateIn,
        responses={201: s.ApiKeyCreatedOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.ApiKeyCreateIn)
        principal = wallet_selectors.principal_get(principal_type=data["principal_type"], principal_id=data["principal_id"])
        api_key, raw_key = party_services.api_key_issue(issuer=self.staff_login, principal=principal)
        return self.render(s.ApiKeyCreatedOut, _with_key(api_key, raw_key), status=201)

    @extend_schema(tags=TAG, summary="Retrieve an API key", responses=s.ApiKeyOut)
    def retrieve(self, request: Request, api_key_id: str) -> Response:
        return self.render(s.ApiKeyOut, wallet_selectors.api_key_get(api_key_id=api_key_id))

    @extend_schema(
        tags=TAG, summary="Rotate a key: a new key now, the old one keeps working for the overlap window",
        request=s.ApiKeyRotateIn, responses={201: s.ApiKeyRotatedOut},
    )
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, api_key_id: str) -> Response:
        old = wallet_selectors.api_key_get(api_key_id=api_key_id)
        data = self.validated(s.ApiKeyRotateIn)
        new_key, raw_key = party_services.api_key_rotate(
            api_key=old, issuer=self.staff_login, overlap=timedelta(seconds=data["overlap_seconds"])
        )
        return self.render(s.ApiKeyRotatedOut, _with_key(new_key, raw_key, replaces=old), status=201)

    @extend_schema(tags=TAG, summary="Revoke a key now", request=s.EmptyIn, responses={200: s.ApiKeyOut})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, api_key_id: str) -> Response:
        api_key = wallet_selectors.api_key_get(api_key_id=api_key_id)
        self.validated(s.EmptyIn)
        api_key = party_services.api_key_revoke(api_key=api_key)
        return self.render(s.ApiKeyOut, api_key)


def _with_key(api_key: Any, raw_key: str, **extra: Any) -> Any:
    # The raw key lives only in this response: it is never stored, logged or cached.
    api_key.key = raw_key
    for name, value in extra.items():
        setattr(api_key, name, value)
    return api_key


class AdjustmentViewSet(AdminViewSet):
    lookup_url_kwarg = "adjustment_id"
    action_permissions = _permissions("payments.view_adjustment", create="payments.add_pendingadjustment")

    @extend_schema(tags=TAG, summary="List adjustments", parameters=[ListParamsSerializer], responses=s.AdjustmentList)
    def list(self, request: Request) -> Response:
        return self.list_response(payment_selectors.adjustments_list(), s.AdjustmentOut, self.query(ListParamsSerializer))

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

    @extend_schema(tags=TAG, summary="Retrieve an adjustment", responses=s.AdjustmentOut)
    def retrieve(self, request: Request, adjustment_id: str) -> Response:
        return self.render(s.AdjustmentOut, payment_selectors.adjustment_get(adjustment_id=adjustment_id))


class PendingAdjustmentViewSet(AdminViewSet):
    lookup_url_kwarg = "pending_adjustment_id"
    action_permissions = _permissions(
        "payments.view_pendingadjustment", approve="payments.approve_pendingadjustment", reject="payments.approve_pendingadjustment"
    )

    @extend_schema(
        tags=TAG, summary="List adjustments held for a second staff member's approval", parameters=[s.PendingAdjustmentListParams],
        responses=s.PendingAdjustmentList,
    )
    def list(self, request: Request) -> Response:
        params = self.query(s.PendingAdjustmentListParams)
        rows = payment_selectors.pending_adjustments_list(status=params.get("status"))
        return self.list_response(rows, s.PendingAdjustmentOut, params)

    @extend_schema(tags=TAG, summary="Retrieve a held adjustment", responses=s.PendingAdjustmentOut)
    def retrieve(self, request: Request, pending_adjustment_id: str) -> Response:
        return self.render(s.PendingAdjustmentOut, payment_selectors.pending_adjustment_get(pending_id=pending_adjustment_id))

    @extend_schema(
        tags=TAG, summary="Approve and post another staff member's held adjustment (never your own)", request=s.EmptyIn,
        responses={200: s.PendingAdjustmentOut},
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pending_adjustment_id: str) -> Response:
        pending = payment_selectors.pending_adjustment_get(pending_id=pending_adjustment_id)
        self.validated(s.EmptyIn)
        approvals.pending_adjustment_approve(pending=pending, checker=self.staff)
        return self.render(s.PendingAdjustmentOut, payment_selectors.pending_adjustment_get(pending_id=pending_adjustment_id))

    @extend_schema(
        tags=TAG, summary="Reject another staff member's held adjustment (nothing is posted)", request=s.PendingAdjustmentRejectIn,
        responses={200: s.PendingAdjustmentOut},
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pending_adjustment_id: str) -> Response:
        pending = payment_selectors.pending_adjustment_get(pending_id=pending_adjustment_id)
        data = self.validated(s.PendingAdjustmentRejectIn)
        return self.render(s.PendingAdjustmentOut, approvals.pending_adjustment_reject(pending=pending, checker=self.staff, reason=data["reason"]))
