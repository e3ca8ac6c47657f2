"""Reads of merchant webhook endpoints, always scoped to the merchant."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Min, QuerySet
from django.db.models.functions import Coalesce

from payments.models import OutboxEvent
from wallets.errors import NotFound
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpoint, WebhookEndpointStatus


def webhook_endpoint_list(*, merchant_id: str) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(merchant_id=merchant_id)


def webhook_endpoint_get(*, merchant_id: str, endpoint_id: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(merchant_id=merchant_id, pk=endpoint_id).first()
    if endpoint is None:  # unknown, or another merchant's: the same answer
        raise NotFound("no such webhook endpoint")
    return endpoint


def webhook_delivery_list(*, merchant_id: str, endpoint_id: str) -> QuerySet[WebhookDelivery]:
    """One endpoint's deliveries, newest first (the endpoint must be the merchant's)."""
    endpoint = webhook_endpoint_get(merchant_id=merchant_id, endpoint_id=endpoint_id)
    return WebhookDelivery.objects.filter(endpoint=endpoint)


def webhook_delivery_get(*, merchant_id: str, endpoint_id: str, delivery_id: str) -> WebhookDelivery:
    endpoint = webhook_endpoint_get(merchant_id=merchant_id, endpoint_id=endpoint_id)
    delivery = WebhookDelivery.objects.filter(endpoint=endpoint, pk=delivery_id).first()
    if delivery is None:  # unknown, or another endpoint's: the same answer
        raise NotFound("no such webhook delivery", param="delivery")
    return delivery


def webhook_deliveries_due_exist(*, now: datetime) -> bool:
    """Whether any enabled endpoint of this tenant has a delivery due at `now`."""
    return WebhookDelivery.objects.filter(
        status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=now, endpoint__status=WebhookEndpointStatus.ENABLED
    ).exists()


def relay_work_next_due_at(*, now: datetime) -> datetime | None:
    """When this tenant's relay next has work: the earliest live unpublished event (its
    backoff, else its creation), `now` while a delivery is being sent (its outcome may
    schedule a retry sooner than its lease ends), else the earliest pending delivery of an
    enabled endpoint; None when there is nothing at all. Events are read before deliveries:
    an event published in between has made its deliveries by the second read."""
    dues: list[datetime] = []
    event_due = OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True).aggregate(
        due=Min(Coalesce("next_attempt_at", "created"))
    )["due"]
    if event_due is not None:
        dues.append(event_due)
    pending = WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.PENDING, endpoint__status=WebhookEndpointStatus.ENABLED)
    if pending.filter(leased_until__gt=now).exists():
        dues.append(now)
    delivery_due = pending.order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first()
    if delivery_due is not None:
        dues.append(delivery_due)
    return min(dues, default=None)
