"""Merchant face (`sk_` keys): payments, refunds, intents, payouts, balance, stores, terminals.
Everything is scoped to the key's merchant. Routed by config/api_urls.py; the merchant's
webhook endpoints live in webhooks.api."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http.response import HttpResponseBase
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import MerchantViewSet
from apikit.viewsets import CreateMixin, ListMixin, RetrieveMixin, object_action
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.api.statements import StatementMixin, statement_schema
from payments.models import Payment, PaymentIntent, Payout, Refund
from payments.services import intents, mandates, payouts, refunds
from payments.statements import Viewer, statement_account_get
from wallets import selectors as wallet_selectors
from wallets.books import account_balance_lines_at
from wallets.daily_totals import merchant_daily_totals
from wallets.models import Account, Store, Terminal

TAG = ["merchant"]


class StoreViewSet(ListMixin, RetrieveMixin, MerchantViewSet):
    lookup_url_kwarg = "store_id"
    out = s.StoreOut
    summaries = {"list": "List the merchant's stores", "retrieve": "Retrieve one of the merchant's stores"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Store]:
        return wallet_selectors.store_list(merchant_id=self.merchant_id)

    def object_get(self, store_id: str) -> Store:
        return wallet_selectors.store_get(store_id=store_id, merchant_id=self.merchant_id)


class TerminalViewSet(ListMixin, RetrieveMixin, MerchantViewSet):
    lookup_url_kwarg = "terminal_id"
    out = s.TerminalOut
    summaries = {"list": "List the merchant's terminals", "retrieve": "Retrieve one of the merchant's terminals"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Terminal]:
        return wallet_selectors.terminal_list(merchant_id=self.merchant_id)

    def object_get(self, terminal_id: str) -> Terminal:
        return wallet_selectors.terminal_get(terminal_id=terminal_id, merchant_id=self.merchant_id)


class BalanceViewSet(MerchantViewSet):
    @extend_schema(
        tags=TAG, summary="The merchant's balances per asset, each split into available and pending by the settlement delay",
        description="Per asset: available + pending = balance - held, both >= 0. Credits younger than the settlement delay (the"
        " merchant's, else the tenant's; default 2 days) are pending: a credit on UTC day D is available from 00:00 UTC of D + delay + 1"
        " (at least `delay` full days). A failed or canceled payout's money coming back is available at once, as it was when it left."
        " Refunds and reversals draw on available first, then pending. `available` is what POST /v1/merchant/payouts may take."
        " With `at`: each asset's `balance` as of that instant, from the ledger (`available`, `pending` and `held` null); an asset"
        " held now but not then answers 0. A malformed `at`, one without an offset, or one in the future: 400.",
        parameters=[s.BalanceAtParams], responses=s.MerchantBalanceOut,
    )
    def list(self, request: Request) -> Response:
        at = self.query(s.BalanceAtParams).get("at")
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        if at is None:
            balances: list[Any] = list(payment_selectors.merchant_balances(merchant=merchant))
        else:
            balances = [{**line, "available": None, "pending": None, "held": None}
                        for line in account_balance_lines_at(account_id=merchant.account.pk, at=at)]
        return self.render(s.MerchantBalanceOut, {"merchant": merchant.pk, "at": at, "balances": balances})

    @extend_schema(
        tags=TAG, summary="The merchant's balance history: credited, debited and net per UTC day and asset, newest first",
        parameters=[s.BalanceHistoryParams], responses=s.DailyTotalList,
    )
    @action(detail=False, methods=["get"])
    def history(self, request: Request) -> Response:
        params = self.query(s.BalanceHistoryParams)
        days = {"day_from": params["day_from"], "day_to": params["day_to"]}
        totals = merchant_daily_totals(merchant_id=self.merchant_id, asset_code=params.get("asset"), **days)
        return self.render(s.DailyTotalList, {"object": "list", "data": totals, "next_cursor": params["next_cursor"]})


class PaymentViewSet(ListMixin, RetrieveMixin, MerchantViewSet):
    lookup_url_kwarg = "payment_id"
    out, list_params = s.PaymentOut, s.AssetListParams
    summaries = {"list": "The merchant's payments", "retrieve": "Retrieve one of the merchant's payments"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Payment]:
        return payment_selectors.payments_list(merchant_id=self.merchant_id, asset_code=params.get("asset"))

    def object_get(self, payment_id: str) -> Payment:
        return payment_selectors.payment_get(payment_id=payment_id, merchant_id=self.merchant_id)


class RefundViewSet(ListMixin, CreateMixin, RetrieveMixin, MerchantViewSet):
    lookup_url_kwarg = "refund_id"
    out, create_in = s.RefundOut, s.RefundCreateIn
    summaries = {
        "list": "The merchant's refunds", "create": "Refund a payment, partly or fully, as often as what is left allows",
        "retrieve": "Retrieve one of the merchant's refunds",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[Refund]:
        return payment_selectors.refunds_list(merchant_id=self.merchant_id)

    def object_create(self, data: dict[str, Any]) -> Refund:
        payment = payment_selectors.payment_get(payment_id=data["payment"], merchant_id=self.merchant_id)
        return refunds.refund_create(payment=payment, amount=data["amount"], reason=data["reason"])

    def object_get(self, refund_id: str) -> Refund:
        return payment_selectors.refund_get(refund_id=refund_id, merchant_id=self.merchant_id)


class PaymentIntentViewSet(ListMixin, CreateMixin, RetrieveMixin, MerchantViewSet):
    lookup_url_kwarg = "intent_id"
    out, create_in = s.PaymentIntentOut, s.PaymentIntentCreateIn
    summaries = {
        "list": "The merchant's payment intents", "create": "Create a payment intent (automatic or manual capture)",
        "retrieve": "Retrieve a payment intent",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[PaymentIntent]:
        return payment_selectors.payment_intents_list(merchant_id=self.merchant_id)

    def object_create(self, data: dict[str, Any]) -> PaymentIntent:
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        # The charge-by-id rule first: refused alike whether the customer id exists or not.
        mandates.charge_by_customer_id_check(customer_id=data["customer"], merchant_id=self.merchant_id)
        customer = wallet_selectors.customer_get(customer_id=data["customer"], param="customer")
        return intents.payment_intent_create(
            merchant=merchant, customer=customer, asset_code=data["asset"], amount=data["amount"], capture_method=data["capture_method"]
        )

    def object_get(self, intent_id: str) -> PaymentIntent:
        return payment_selectors.payment_intent_get(intent_id=intent_id, merchant_id=self.merchant_id)

    @object_action(TAG, summary="Change the amount (only while created)", body=s.PaymentIntentUpdateIn, out=s.PaymentIntentOut, route=False)
    def update(self, intent: PaymentIntent, data: dict[str, Any]) -> PaymentIntent:
        return intents.payment_intent_update_amount(intent=intent, amount=data["amount"])

    @object_action(
        TAG, summary="Confirm: charge now (automatic capture) or hold the funds (manual capture)", body=s.EmptyIn, out=s.PaymentIntentOut
    )
    def confirm(self, intent: PaymentIntent, data: dict[str, Any]) -> PaymentIntent:
        return intents.payment_intent_confirm(intent=intent)

    @object_action(
        TAG, summary="Authorize a manual-capture intent: hold the amount on the customer's wallet", body=s.EmptyIn, out=s.PaymentIntentOut
    )
    def authorize(self, intent: PaymentIntent, data: dict[str, Any]) -> PaymentIntent:
        return intents.payment_intent_authorize(intent=intent)

    @object_action(
        TAG, summary="Capture an authorized intent, fully or partly (the rest is released)", body=s.PaymentIntentCaptureIn,
        out=s.PaymentIntentOut,
    )
    def capture(self, intent: PaymentIntent, data: dict[str, Any]) -> PaymentIntent:
        return intents.payment_intent_capture(intent=intent, amount=data.get("amount_to_capture"))

    @object_action(TAG, summary="Cancel a created or authorized intent (releases any hold)", body=s.EmptyIn, out=s.PaymentIntentOut)
    def cancel(self, intent: PaymentIntent, data: dict[str, Any]) -> PaymentIntent:
        return intents.payment_intent_cancel(intent=intent)


class PayoutViewSet(ListMixin, CreateMixin, RetrieveMixin, MerchantViewSet):
    lookup_url_kwarg = "payout_id"
    out, create_in, list_params = s.PayoutOut, s.PayoutCreateIn, s.PayoutListParams
    summaries = {
        "list": "The merchant's payouts, newest first",
        "create": "Pay out available funds to the merchant's bank account (at most `available`: 402 insufficient_available)",
        "retrieve": "Retrieve one of the merchant's payouts",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[Payout]:
        return payment_selectors.payouts_list(merchant_id=self.merchant_id, asset_code=params.get("asset"), status=params.get("status"))

    def object_create(self, data: dict[str, Any]) -> Payout:
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        return payouts.payout_create(merchant=merchant, asset_code=data["asset"], amount=data["amount"])

    def object_get(self, payout_id: str) -> Payout:
        return payment_selectors.payout_get(payout_id=payout_id, merchant_id=self.merchant_id)


# --- Statements (payments/api/statements.py) -------------------------------------------


class StatementViewSet(StatementMixin, MerchantViewSet):
    viewer = Viewer.MERCHANT

    def statement_account(self) -> tuple[Account, str, str]:
        return statement_account_get(merchant_id=self.merchant_id)

    @statement_schema(TAG[0])
    def list(self, request: Request) -> HttpResponseBase:
        return self.statement()
