"""Merchant face (`sk_` keys): the merchant's webhook endpoints and events. Reads through
webhooks.selectors, writes through webhooks.services, always scoped to the key's merchant."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import MerchantViewSet
from apikit.pagination import ListParamsSerializer
from apikit.viewsets import ListMixin, RetrieveMixin, object_action
from payments.models import OutboxEvent
from wallets import selectors as wallet_selectors
from webhooks import selectors as webhook_selectors
from webhooks.api import serializers as s
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import deliveries as delivery_services
from webhooks.services import endpoints as webhook_services

TAG = ["merchant"]


class WebhookEndpointViewSet(ListMixin, RetrieveMixin, MerchantViewSet):
    # create and rotate_secret answer a signing secret shown once: the idempotency layer
    # seals the stored body of every POST of this viewset (update's too, which is harmless:
    # replays unseal).
    idempotency_response_contains_secret = True
    lookup_url_kwarg = "endpoint_id"
    out = s.WebhookEndpointOut
    summaries = {"list": "List webhook endpoints", "retrieve": "Retrieve a webhook endpoint (never its secret)"}

    def objects(self, params: dict[str, Any]) -> QuerySet[WebhookEndpoint]:
        return webhook_selectors.webhook_endpoint_list(merchant_id=self.merchant_id)

    def object_get(self, endpoint_id: str) -> WebhookEndpoint:
        return webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)

    @extend_schema(
        tags=TAG, summary="Register a webhook endpoint (the signing secret is shown once)",
        request=s.WebhookEndpointCreateIn, responses={201: s.WebhookEndpointWithSecretOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.WebhookEndpointCreateIn)
        merchant = wallet_selectors.merchant_get(merchant_id=self.merchant_id)
        endpoint, secret = webhook_services.webhook_endpoint_create(
            merchant=merchant, url=data["url"], enabled_events=data["enabled_events"], description=data["description"]
        )
        return self.render(s.WebhookEndpointOut, endpoint, status=201, secret=secret)

    @object_action(TAG, summary="Update a webhook endpoint", body=s.WebhookEndpointUpdateIn, out=s.WebhookEndpointOut, route=False)
    def update(self, endpoint: WebhookEndpoint, data: dict[str, Any]) -> WebhookEndpoint:
        return webhook_services.webhook_endpoint_update(endpoint=endpoint, **data)

    @object_action(
        TAG, summary="Rotate the signing secret (the new one is shown once; the old one signs during the overlap)",
        body=s.WebhookSecretRotateIn, out=s.WebhookEndpointWithSecretOut,
    )
    def rotate_secret(self, endpoint: WebhookEndpoint, data: dict[str, Any]) -> WebhookEndpoint:
        endpoint, secret = webhook_services.webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(seconds=data["overlap_seconds"]))
        endpoint.secret = secret  # type: ignore[attr-defined]  # in this answer only, never stored
        return endpoint

    @extend_schema(
        tags=TAG, summary="List an endpoint's webhook deliveries (newest first)",
        parameters=[ListParamsSerializer], responses=s.WebhookDeliveryList,
    )
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, endpoint_id: str) -> Response:
        deliveries = webhook_selectors.webhook_delivery_list(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        self.query(ListParamsSerializer)
        return self.list_response(deliveries, s.WebhookDeliveryOut)

    @object_action(
        TAG, summary="Send one of the endpoint's deliveries again (due now, with a fresh retry window)", body=s.WebhookRedeliverIn,
        out=s.WebhookDeliveryOut,
    )
    def redeliver(self, endpoint: WebhookEndpoint, data: dict[str, Any]) -> WebhookDelivery:
        delivery = webhook_selectors.webhook_delivery_get(merchant_id=self.merchant_id, endpoint_id=endpoint.pk, delivery_id=data["delivery"])
        return delivery_services.webhook_delivery_redeliver(delivery=delivery)


class EventViewSet(ListMixin, RetrieveMixin, MerchantViewSet):
    """The merchant's events of the last 30 days, as its webhooks carry them: what a
    receiver catches up from after its endpoint was down or disabled (SPEC 8)."""

    lookup_url_kwarg = "event_id"
    out, list_params = s.EventOut, s.EventListParams
    summaries = {
        "list": "List the merchant's events of the last 30 days (newest first)",
        "retrieve": "Retrieve one of the merchant's events (last 30 days)",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[OutboxEvent]:
        return webhook_selectors.merchant_event_list(merchant_id=self.merchant_id, topic=params.get("type"))

    def object_get(self, event_id: str) -> OutboxEvent:
        return webhook_selectors.merchant_event_get(merchant_id=self.merchant_id, event_id=event_id)
