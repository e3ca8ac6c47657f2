"""Reads of merchant webhook endpoints and events, always scoped to the merchant."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Min, OuterRef, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.utils import timezone

from payments.models import OutboxEvent
from wallets.errors import NotFound
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpoint, WebhookEndpointStatus

# How far back a merchant can list its events (SPEC 8: a receiver catches up from there).
EVENTS_LISTED_DAYS = 30


def merchant_event_list(*, merchant_id: str, topic: str | None = None, now: datetime | None = None) -> QuerySet[OutboxEvent]:
    """The merchant's events of the last 30 days (those whose object names it: the events
    its endpoints get), of type `topic` if given; newest first once paginated. Read through
    the outbox index on (payload->>'merchant', created, id)."""
    since = (now or timezone.now()) - timedelta(days=EVENTS_LISTED_DAYS)
    events = OutboxEvent.objects.alias(merchant=KT("payload__merchant")).filter(merchant=merchant_id, created__gte=since)
    return events.filter(topic=topic) if topic is not None else events


def merchant_event_get(*, merchant_id: str, event_id: str, now: datetime | None = None) -> OutboxEvent:
    event = merchant_event_list(merchant_id=merchant_id, now=now).filter(pk=event_id).first()
    if event is None:  # unknown, another merchant's, or older than 30 days: the same answer
        raise NotFound("no such event")
    return event


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


def _enabled_endpoints_earliest_pending() -> datetime | None:
    """The earliest `next_attempt_at` of a pending delivery of an enabled endpoint: one probe
    of the (endpoint, next_attempt_at) index per enabled endpoint. Not one walk of the due
    index in time order: a disabled endpoint's waiting deliveries (due long ago, never
    claimed) would lie in front, as many as the events it missed."""
    earliest = (
        WebhookDelivery.objects.filter(endpoint=OuterRef("pk"), status=WebhookDeliveryStatus.PENDING)
        .order_by("next_attempt_at")
        .values("next_attempt_at")[:1]
    )
    due: datetime | None = (
        WebhookEndpoint.objects.filter(status=WebhookEndpointStatus.ENABLED).annotate(earliest=Subquery(earliest)).aggregate(due=Min("earliest"))
    )["due"]
    return due


def webhook_deliveries_due_exist(*, now: datetime) -> bool:
    """Whether any enabled endpoint of this tenant has a delivery due at `now`."""
    due = _enabled_endpoints_earliest_pending()
    return due is not None and due <= now


def relay_work_next_due_at(*, now: datetime) -> datetime | None:
    """When this tenant's relay next has work: the earliest live unpublished event (its
    backoff, else its creation), `now` while a delivery is being sent (its outcome may
    schedule a retry sooner than its lease ends), else the earliest pending delivery of an
    enabled endpoint (a disabled endpoint's wait: enabling it marks the relay due); None
    when there is nothing at all. Events are read before deliveries: an event published in
    between has made its deliveries by the second read."""
    unpublished = OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True)
    event_due = unpublished.aggregate(due=Min(Coalesce("next_attempt_at", "created")))["due"]
    # Leased (in flight) rows are few, and have their own index.
    pending = WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.PENDING, endpoint__status=WebhookEndpointStatus.ENABLED)
    in_flight = now if pending.filter(leased_until__gt=now).exists() else None
    return min((due for due in (event_due, in_flight, _enabled_endpoints_earliest_pending()) if due is not None), default=None)
