"""Merchant face (`sk_` keys): payments, refunds, intents, balance, stores, terminals,
webhook endpoints. Everything is scoped to the key's merchant."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.api.base import MerchantView
from payments.api.pagination import ListParamsSerializer
from payments.models import PaymentIntent
from payments.services import intents, refunds
from wallets import selectors as wallet_selectors
from webhooks import selectors as webhook_selectors
from webhooks import services as webhook_services

TAG = ["merchant"]


class _MerchantView(MerchantView):
    @property
    def merchant_id(self) -> str:
        merchant_id = self.principal.merchant_id
        assert merchant_id is not None
        return merchant_id


class StoresView(_MerchantView):
    @extend_schema(tags=TAG, summary="List the merchant's stores", parameters=[ListParamsSerializer], responses=s.StoreList)
    def get(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.store_list(merchant_id=self.merchant_id), s.StoreOut, self.query(ListParamsSerializer))


class StoreDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's stores", responses=s.StoreOut)
    def get(self, request: Request, store_id: str) -> Response:
        return self.render(s.StoreOut, wallet_selectors.store_get(store_id=store_id, merchant_id=self.merchant_id))


class TerminalsView(_MerchantView):
    @extend_schema(tags=TAG, summary="List the merchant's terminals", parameters=[ListParamsSerializer], responses=s.TerminalList)
    def get(self, request: Request) -> Response:
        return self.list_response(wallet_selectors.terminal_list(merchant_id=self.merchant_id), s.TerminalOut, self.query(ListParamsSerializer))


class TerminalDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's terminals", responses=s.TerminalOut)
    def get(self, request: Request, terminal_id: str) -> Response:
        return self.render(s.TerminalOut, wallet_selectors.terminal_get(terminal_id=terminal_id, merchant_id=self.merchant_id))


class WebhookEndpointsView(_MerchantView):
    idempotency_response_contains_secret = True  # the answer holds a secret shown once

    @extend_schema(tags=TAG, summary="List webhook endpoints", parameters=[ListParamsSerializer], responses=s.WebhookEndpointList)
    def get(self, request: Request) -> Response:
        endpoints = webhook_selectors.webhook_endpoint_list(merchant_id=self.merchant_id)
        return self.list_response(endpoints, s.WebhookEndpointOut, self.query(ListParamsSerializer))

    @extend_schema(
        tags=TAG, summary="Register a webhook endpoint (the signing secret is shown once)",
        request=s.WebhookEndpointCreateIn, responses={201: s.WebhookEndpointWithSecretOut},
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.WebhookEndpointCreateIn)
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        endpoint, secret = webhook_services.webhook_endpoint_create(
            merchant=merchant, url=data["url"], enabled_events=data["enabled_events"], description=data["description"]
        )
        return self.render(s.WebhookEndpointOut, endpoint, status=201, secret=secret)


class WebhookEndpointDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve a webhook endpoint (never its secret)", responses=s.WebhookEndpointOut)
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        return self.render(s.WebhookEndpointOut, endpoint)

    @extend_schema(tags=TAG, summary="Update a webhook endpoint", request=s.WebhookEndpointUpdateIn, responses={200: s.WebhookEndpointOut})
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        data = self.validated(s.WebhookEndpointUpdateIn)
        endpoint = webhook_services.webhook_endpoint_update(endpoint=endpoint, **data)
        return self.render(s.WebhookEndpointOut, endpoint)


class WebhookEndpointRotateSecretView(_MerchantView):
    idempotency_response_contains_secret = True  # the answer holds a secret shown once

    @extend_schema(
        tags=TAG, summary="Rotate the signing secret (the new one is shown once; the old one signs during the overlap)",
        request=s.WebhookSecretRotateIn, responses={200: s.WebhookEndpointWithSecretOut},
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        data = self.validated(s.WebhookSecretRotateIn)
        endpoint, secret = webhook_services.webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(seconds=data["overlap_seconds"]))
        return self.render(s.WebhookEndpointOut, endpoint, secret=secret)


class BalanceView(_MerchantView):
    @extend_schema(tags=TAG, summary="The merchant's balances per asset", responses=s.MerchantBalanceOut)
    def get(self, request: Request) -> Response:
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        return self.render(s.MerchantBalanceOut, {"merchant": merchant.pk, "balances": payment_selectors.merchant_balances(merchant=merchant)})


class PaymentsView(_MerchantView):
    @extend_schema(tags=TAG, summary="The merchant's payments", parameters=[s.PaymentListParams], responses=s.PaymentList)
    def get(self, request: Request) -> Response:
        params = self.query(s.PaymentListParams)
        payments = payment_selectors.payments_list(merchant_id=self.merchant_id)
        if params.get("asset"):
            payments = payments.filter(asset_id=params["asset"])
        return self.list_response(payments, s.PaymentOut, params)


class PaymentDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's payments", responses=s.PaymentOut)
    def get(self, request: Request, payment_id: str) -> Response:
        return self.render(s.PaymentOut, payment_selectors.payment_get(payment_id=payment_id, merchant_id=self.merchant_id))


class RefundsView(_MerchantView):
    @extend_schema(tags=TAG, summary="The merchant's refunds", parameters=[ListParamsSerializer], responses=s.RefundList)
    def get(self, request: Request) -> Response:
        return self.list_response(payment_selectors.refunds_list(merchant_id=self.merchant_id), s.RefundOut, self.query(ListParamsSerializer))

    @extend_schema(
        tags=TAG, summary="Refund a payment, partly or fully, as often as what is left allows",
        request=s.RefundCreateIn, responses={201: s.RefundOut},
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.RefundCreateIn)
        payment = payment_selectors.payment_get(payment_id=data["payment"], merchant_id=self.merchant_id)
        refund = refunds.refund_create(payment=payment, amount=data["amount"], reason=data["reason"])
        return self.render(s.RefundOut, refund, status=201)


class RefundDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's refunds", responses=s.RefundOut)
    def get(self, request: Request, refund_id: str) -> Response:
        return self.render(s.RefundOut, payment_selectors.refund_get(refund_id=refund_id, merchant_id=self.merchant_id))


class PaymentIntentsView(_MerchantView):
    @extend_schema(tags=TAG, summary="The merchant's payment intents", parameters=[ListParamsSerializer], responses=s.PaymentIntentList)
    def get(self, request: Request) -> Response:
        intents = payment_selectors.payment_intents_list(merchant_id=self.merchant_id)
        return self.list_response(intents, s.PaymentIntentOut, self.query(ListParamsSerializer))

    @extend_schema(
        tags=TAG, summary="Create a payment intent (automatic or manual capture)", request=s.PaymentIntentCreateIn,
        responses={201: s.PaymentIntentOut},
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.PaymentIntentCreateIn)
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        customer = wallet_selectors.customer_get(customer_id=data["customer"], param="customer")
        intent = intents.payment_intent_create(
            merchant=merchant, customer=customer, asset_code=data["asset"], amount=data["amount"], capture_method=data["capture_method"]
        )
        return self.render(s.PaymentIntentOut, intent, status=201)


class _IntentView(_MerchantView):
    def intent(self, intent_id: str) -> PaymentIntent:
        return payment_selectors.payment_intent_get(intent_id=intent_id, merchant_id=self.merchant_id)


class PaymentIntentDetailView(_IntentView):
    @extend_schema(tags=TAG, summary="Retrieve a payment intent", responses=s.PaymentIntentOut)
    def get(self, request: Request, intent_id: str) -> Response:
        return self.render(s.PaymentIntentOut, self.intent(intent_id))

    @extend_schema(
        tags=TAG, summary="Change the amount (only while created)", request=s.PaymentIntentUpdateIn, responses={200: s.PaymentIntentOut}
    )
    def post(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)  # another merchant's intent is a 404 whatever the body
        data = self.validated(s.PaymentIntentUpdateIn)
        intent = intents.payment_intent_update_amount(intent=intent, amount=data["amount"])
        return self.render(s.PaymentIntentOut, intent)


class PaymentIntentConfirmView(_IntentView):
    @extend_schema(
        tags=TAG, summary="Confirm: charge now (automatic capture) or hold the funds (manual capture)",
        request=s.EmptyIn, responses={200: s.PaymentIntentOut},
    )
    def post(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        self.validated(s.EmptyIn)
        return self.render(s.PaymentIntentOut, intents.payment_intent_confirm(intent=intent))


class PaymentIntentAuthorizeView(_IntentView):
    @extend_schema(
        tags=TAG, summary="Authorize a manual-capture intent: hold the amount on the customer's wallet",
        request=s.EmptyIn, responses={200: s.PaymentIntentOut},
    )
    def post(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        self.validated(s.EmptyIn)
        return self.render(s.PaymentIntentOut, intents.payment_intent_authorize(intent=intent))


class PaymentIntentCaptureView(_IntentView):
    @extend_schema(
        tags=TAG, summary="Capture an authorized intent, fully or partly (the rest is released)",
        request=s.PaymentIntentCaptureIn, responses={200: s.PaymentIntentOut},
    )
    def post(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        data = self.validated(s.PaymentIntentCaptureIn)
        intent = intents.payment_intent_capture(intent=intent, amount=data.get("amount_to_capture"))
        return self.render(s.PaymentIntentOut, intent)


class PaymentIntentCancelView(_IntentView):
    @extend_schema(
        tags=TAG, summary="Cancel a created or authorized intent (releases any hold)", request=s.EmptyIn, responses={200: s.PaymentIntentOut}
    )
    def post(self, request: Request, intent_id: str) -> Response:
        intent = self.intent(intent_id)
        self.validated(s.EmptyIn)
        return self.render(s.PaymentIntentOut, intents.payment_intent_cancel(intent=intent))
