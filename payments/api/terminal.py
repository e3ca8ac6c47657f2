"""Terminal face (`tk_` keys): a storefront device bound to one store of one merchant.
Routed by config/api_urls.py."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from apikit.base import TerminalViewSet
from apikit.viewsets import CreateMixin, ListMixin, RetrieveMixin
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.models import Payment, Refund
from payments.services import charges, refunds


class PaymentViewSet(ListMixin, CreateMixin, RetrieveMixin, TerminalViewSet):
    lookup_url_kwarg = "payment_id"
    out, list_params, create_in = s.PaymentOut, s.AssetListParams, s.TerminalPaymentCreateIn
    summaries = {
        "list": "Payments taken at this terminal's store", "create": "Take a payment from a customer (scanned payment token, or customer id)",
        "retrieve": "Retrieve a payment of this terminal's store",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[Payment]:
        return payment_selectors.payments_list(store_id=self.terminal.store_id, asset_code=params.get("asset"))

    def object_create(self, data: dict[str, Any]) -> Payment:
        if data.get("customer_token"):
            return charges.payment_create_with_token(
                terminal=self.terminal, customer_token=data["customer_token"], asset_code=data["asset"], amount=data["amount"]
            )
        # The payment statement itself answers 404 for an unknown customer.
        return charges.payment_create(terminal=self.terminal, customer_id=data["customer"], asset_code=data["asset"], amount=data["amount"])

    def object_get(self, payment_id: str) -> Payment:
        return payment_selectors.payment_get(payment_id=payment_id, store_id=self.terminal.store_id)


class RefundViewSet(CreateMixin, TerminalViewSet):
    out, create_in = s.RefundOut, s.RefundCreateIn
    summaries = {"create": "Refund a payment of this store taken today (partial or full)"}

    def object_create(self, data: dict[str, Any]) -> Refund:
        return refunds.terminal_refund_create(terminal=self.terminal, payment_id=data["payment"], amount=data["amount"], reason=data["reason"])
