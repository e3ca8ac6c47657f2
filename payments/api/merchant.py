"""Merchant face (`sk_` keys): payments, refunds, intents, balance, stores, terminals.
Everything is scoped to the key's merchant. Routed by config/api_urls.py; the merchant's
webhook endpoints live in webhooks.api."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import MerchantViewSet
from apikit.pagination import ListParamsSerializer
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.models import PaymentIntent
from payments.services import intents, mandates, refunds
from wallets import selectors as wallet_selectors
from wallets.daily_totals import merchant_daily_totals

TAG = ["merchant"]


class StoreViewSet(MerchantViewSet):
    lookup_url_kwarg = "store_id"

    @extend_schema(tags=TAG, summary="List the merchant's stores", parameters=[ListParamsSerializer], responses=s.StoreList)
    def list(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.store_list(merchant_id=self.merchant_id), s.StoreOut, self.query(ListParamsSerializer))

    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's stores", responses=s.StoreOut)
    def retrieve(self, request: Request, store_id: str) -> Response:
        return self.render(s.StoreOut, wallet_selectors.store_get(store_id=store_id, merchant_id=self.merchant_id))


class TerminalViewSet(MerchantViewSet):
    lookup_url_kwarg = "terminal_id"

    @extend_schema(tags=TAG, summary="List the merchant's terminals", parameters=[ListParamsSerializer], responses=s.TerminalList)
    def list(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.terminal_list(merchant_id=self.merchant_id), s.TerminalOut, self.query(ListParamsSerializer))

    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's terminals", responses=s.TerminalOut)
    def retrieve(self, request: Request, terminal_id: str) -> Response:
        return self.render(s.TerminalOut, wallet_selectors.terminal_get(terminal_id=terminal_id, merchant_id=self.merchant_id))


class BalanceViewSet(MerchantViewSet):
    @extend_schema(tags=TAG, summary="The merchant's balances per asset", responses=s.MerchantBalanceOut)
    def list(self, request: Request) -> Response:
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        return self.render(s.MerchantBalanceOut, {"merchant": merchant.pk, "balances": payment_selectors.merchant_balances(merchant=merchant)})

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


class PaymentViewSet(MerchantViewSet):
    lookup_url_kwarg = "payment_id"

    @extend_schema(tags=TAG, summary="The merchant's payments", parameters=[s.PaymentListParams], responses=s.PaymentList)
    def list(self, request: Request) -> Response:
        params = self.query(s.PaymentListParams)
        payments = payment_selectors.payments_list(merchant_id=self.merchant_id, asset_code=params.get("asset"))
        return self.list_response(payments, s.PaymentOut, params)

    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's payments", responses=s.PaymentOut)
    def retrieve(self, request: Request, payment_id: str) -> Response:
        return self.render(s.PaymentOut, payment_selectors.payment_get(payment_id=payment_id, merchant_id=self.merchant_id))


class RefundViewSet(MerchantViewSet):
    lookup_url_kwarg = "refund_id"

    @extend_schema(tags=TAG, summary="The merchant's refunds", parameters=[ListParamsSerializer], responses=s.RefundList)
    def list(self, request: Request) -> Response:
        return self.list_response(payment_selectors.refunds_list(merchant_id=self.merchant_id), s.RefundOut, self.query(ListParamsSerializer))

    @extend_schema(
        tags=TAG, summary="Refund a payment, partly or fully, as often as what is left allows",
        request=s.RefundCreateIn, responses={201: s.RefundOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.RefundCreateIn)
        payment = payment_selectors.payment_get(payment_id=data["payment"], merchant_id=self.merchant_id)
        refund = refunds.refund_create(payment=payment, amount=data["amount"], reason=data["reason"])
        return self.render(s.RefundOut, refund, status=201)

    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's refunds", responses=s.RefundOut)
    def retrieve(self, request: Request, refund_id: str) -> Response:
        return self.render(s.RefundOut, payment_selectors.refund_get(refund_id=refund_id, merchant_id=self.merchant_id))


class PaymentIntentViewSet(MerchantViewSet):
    lookup_url_kwarg = "intent_id"

    def intent(self, intent_id: str) -> PaymentIntent:
        return payment_selectors.payment_intent_get(intent_id=intent_id, merchant_id=self.merchant_id)

    @extend_schema(tags=TAG, summary="The merchant's payment intents", parameters=[ListParamsSerializer], responses=s.PaymentIntentList)
    def list(self, request: Request) -> Response:
        intents = payment_selectors.payment_intents_list(merchant_id=self.merchant_id)
        return self.list_response(intents, s.PaymentIntentOut, self.query(ListParamsSerializer))

    @extend_schema(
        tags=TAG, summary="Create a payment intent (automatic or manual capture)", request=s.PaymentIntentCreateIn,
        responses={201: s.PaymentIntentOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.PaymentIntentCreateIn)
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        # The charge-by-id rule first: refused alike whether the customer id exists or not.
        mandates.charge_by_customer_id_check(customer_id=data["customer"], merchant_id=self.merchant_id)
        customer = wallet_selectors.customer_get(customer_id=data["customer"], param="customer")
        intent = intents.payment_intent_create(
            merchant=merchant, customer=customer, asset_code=data["asset"], amount=data["amount"], capture_method=data["capture_method"]
        )
        return self.render(s.PaymentIntentOut, intent, status=201)

    @extend_schema(tags=TAG, summary="Retrieve a payment intent", responses=s.PaymentIntentOut)
    def retrieve(self, request: Request, intent_id: str) -> Response:
        return self.render(s.PaymentIntentOut, self.intent(intent_id))

    @extend_schema(
        tags=TAG, summary="Change the amount (only while created)", request=s.PaymentIntentUpdateIn, responses={200: s.PaymentIntentOut}
    )
    def update(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)  # another merchant's intent is a 404 whatever the body
        data = self.validated(s.PaymentIntentUpdateIn)
        intent = intents.payment_intent_update_amount(intent=intent, amount=data["amount"])
        return self.render(s.PaymentIntentOut, intent)

    @extend_schema(
        tags=TAG, summary="Confirm: charge now (automatic capture) or hold the funds (manual capture)",
        request=s.EmptyIn, responses={200: s.PaymentIntentOut},
    )
    @action(detail=True, methods=["post"])
    def confirm(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        self.validated(s.EmptyIn)
        return self.render(s.PaymentIntentOut, intents.payment_intent_confirm(intent=intent))

    @extend_schema(
        tags=TAG, summary="Authorize a manual-capture intent: hold the amount on the customer's wallet",
        request=s.EmptyIn, responses={200: s.PaymentIntentOut},
    )
    @action(detail=True, methods=["post"])
    def authorize(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        self.validated(s.EmptyIn)
        return self.render(s.PaymentIntentOut, intents.payment_intent_authorize(intent=intent))

    @extend_schema(
        tags=TAG, summary="Capture an authorized intent, fully or partly (the rest is released)",
        request=s.PaymentIntentCaptureIn, responses={200: s.PaymentIntentOut},
    )
    @action(detail=True, methods=["post"])
    def capture(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        data = self.validated(s.PaymentIntentCaptureIn)
        intent = intents.payment_intent_capture(intent=intent, amount=data.get("amount_to_capture"))
        return self.render(s.PaymentIntentOut, intent)

    @extend_schema(
        tags=TAG, summary="Cancel a created or authorized intent (releases any hold)", request=s.EmptyIn, responses={200: s.PaymentIntentOut}
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        self.validated(s.EmptyIn)
        return self.render(s.PaymentIntentOut, intents.payment_intent_cancel(intent=intent))
