"""Terminal face (`tk_` keys): a storefront device bound to one store of one merchant.
Routed by config/api_urls.py."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import TerminalViewSet
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.services import charges, refunds

TAG = ["terminal"]


class PaymentViewSet(TerminalViewSet):
    lookup_url_kwarg = "payment_id"

    @extend_schema(tags=TAG, summary="Payments taken at this terminal's store", parameters=[s.PaymentListParams], responses=s.PaymentList)
    def list(self, request: Request) -> Response:
        params = self.query(s.PaymentListParams)
        payments = payment_selectors.payments_list(store_id=self.terminal.store_id, asset_code=params.get("asset"))
        return self.list_response(payments, s.PaymentOut, params)

    @extend_schema(
        tags=TAG, summary="Take a payment from a customer (scanned payment token, or customer id)",
        request=s.TerminalPaymentCreateIn, responses={201: s.PaymentOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.TerminalPaymentCreateIn)
        if data.get("customer_token"):
            payment = charges.payment_create_with_token(
                terminal=self.terminal, customer_token=data["customer_token"], asset_code=data["asset"], amount=data["amount"]
            )
        else:  # the payment statement itself answers 404 for an unknown customer
            payment = charges.payment_create(
                terminal=self.terminal, customer_id=data["customer"], asset_code=data["asset"], amount=data["amount"]
            )
        return self.render(s.PaymentOut, payment, status=201)

    @extend_schema(tags=TAG, summary="Retrieve a payment of this terminal's store", responses=s.PaymentOut)
    def retrieve(self, request: Request, payment_id: str) -> Response:
        return self.render(s.PaymentOut, payment_selectors.payment_get(payment_id=payment_id, store_id=self.terminal.store_id))


class RefundViewSet(TerminalViewSet):
    @extend_schema(
        tags=TAG, summary="Refund a payment of this store taken today (partial or full)", request=s.RefundCreateIn, responses={201: s.RefundOut}
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.RefundCreateIn)
        refund = refunds.terminal_refund_create(
            terminal=self.terminal, payment_id=data["payment"], amount=data["amount"], reason=data["reason"]
        )
        return self.render(s.RefundOut, refund, status=201)
