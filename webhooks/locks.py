"""Every lock the webhooks app takes, named (the money locks: wallets/locks.py).

Order: an endpoint's row before its delivery rows, always; never with a money lock; none
across an HTTP call. (A give-up takes its endpoint's row SKIP LOCKED after the delivery:
it never waits for it.) Endpoint rows are FOR NO KEY UPDATE (a delivery's insert is not
blocked); in a claim, the endpoint row makes "count in flight, then lease up to the cap" one step."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.conf import settings
from django.db.models import Count, F, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from payments.models import OutboxEvent
from wallets.models import Merchant
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpoint, WebhookEndpointStatus


def outbox_events_claim(*, now: datetime, limit: int) -> QuerySet[OutboxEvent]:
    """Unpublished, live, due outbox rows in (created, id) order, locked, SKIP LOCKED (another relay publishes those)."""
    return (
        OutboxEvent.objects.select_for_update(skip_locked=True)
        .filter(published_at__isnull=True, dead_at__isnull=True)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .order_by("created", "id")[:limit]
    )


def outbox_event_lock(*, event_id: str) -> OutboxEvent:
    """One outbox row, FOR UPDATE (a requeue): taken alone, never with a money lock."""
    return OutboxEvent.objects.select_for_update().get(pk=event_id)


def webhook_endpoint_then_delivery_lock(*, delivery_id: str) -> WebhookDelivery:
    """A delivery's endpoint row, then the delivery row, as a re-enable takes them (one statement
    took the delivery first: a deadlock against a re-enable). A delivery never changes
    endpoint, so its endpoint id is read unlocked first. Returns it with its endpoint attached."""
    endpoint_id = WebhookDelivery.objects.values_list("endpoint_id", flat=True).get(pk=delivery_id)
    endpoint = webhook_endpoint_lock(endpoint_id=endpoint_id)
    delivery = WebhookDelivery.objects.select_for_update().get(pk=delivery_id)
    delivery.endpoint = endpoint
    return delivery


def merchant_lock(*, merchant_id: str) -> Merchant | None:
    """A merchant's row, FOR UPDATE (an endpoint registration counts the merchant's endpoints): taken alone."""
    return Merchant.objects.select_for_update().filter(pk=merchant_id).first()


def webhook_endpoint_lock(*, endpoint_id: str) -> WebhookEndpoint:
    return WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=endpoint_id)


def webhook_endpoint_rows_lock(*, after: str, limit: int, query: Q | None = None) -> list[WebhookEndpoint]:
    """The next `limit` endpoint rows after id `after` (matching `query`), in id order, locked."""
    rows = WebhookEndpoint.objects.filter(pk__gt=after)
    if query is not None:
        rows = rows.filter(query)
    return list(rows.order_by("pk").select_for_update(no_key=True)[:limit])


def _pending() -> QuerySet[WebhookDelivery]:
    return WebhookDelivery.objects.filter(endpoint=OuterRef("pk"), status=WebhookDeliveryStatus.PENDING)


def _with_in_flight(endpoints: QuerySet[WebhookEndpoint], *, now: datetime) -> QuerySet[WebhookEndpoint]:
    """`endpoints` enabled and below their `cap` of `in_flight` (leased past `now`), locked SKIP LOCKED."""
    in_flight = _pending().filter(leased_until__gt=now).order_by().values("endpoint").annotate(n=Count("pk")).values("n")
    return (
        endpoints.select_for_update(no_key=True, skip_locked=True, of=("self",))
        .filter(status=WebhookEndpointStatus.ENABLED)
        .annotate(
            in_flight=Coalesce(Subquery(in_flight, output_field=IntegerField()), 0),
            cap=Coalesce("max_concurrency", settings.TALLY_WEBHOOK_ENDPOINT_CONCURRENCY, output_field=IntegerField()),
        )
        .filter(in_flight__lt=F("cap"))
    )


def webhook_endpoints_due_lock(*, now: datetime, limit: int) -> list[WebhookEndpoint]:
    """Up to `limit` of `_with_in_flight` with a delivery due at `now`, the one whose oldest due delivery is oldest first."""
    due = _pending().filter(next_attempt_at__lte=now).order_by("next_attempt_at").values("next_attempt_at")[:1]
    return list(
        _with_in_flight(WebhookEndpoint.objects.all(), now=now)
        .annotate(oldest_due=Subquery(due))
        .filter(oldest_due__isnull=False)
        .order_by("oldest_due", "pk")[:limit]
    )


def webhook_endpoints_lock(*, endpoint_ids: Sequence[str], now: datetime) -> list[WebhookEndpoint]:
    """These endpoints (a refill: answers just came back) of `_with_in_flight`, in id order."""
    return list(_with_in_flight(WebhookEndpoint.objects.filter(pk__in=list(endpoint_ids)), now=now).order_by("pk"))


def webhook_deliveries_due_lock(*, endpoint_id: str, now: datetime, limit: int) -> list[WebhookDelivery]:
    """Up to `limit` of the endpoint's deliveries due at `now`, oldest due first, with their
    events, locked SKIP LOCKED. The caller holds the endpoint's row."""
    return list(
        WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("event")
        .filter(endpoint_id=endpoint_id, status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "pk")[:limit]
    )


def webhook_deliveries_waited_out_lock(*, now: datetime, limit: int) -> list[str]:
    """Up to `limit` ids of pending, unleased deliveries whose window closed (by `now`) while
    their endpoint was disabled (it still is, or was enabled only after), locked SKIP LOCKED,
    oldest window first. Endpoint rows are read, not locked: a row past its window stays past it."""
    return list(
        WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(status=WebhookDeliveryStatus.PENDING, give_up_at__lte=now)
        .filter(Q(leased_until__isnull=True) | Q(leased_until__lte=now))
        .filter(Q(endpoint__status=WebhookEndpointStatus.DISABLED) | Q(give_up_at__lte=F("endpoint__enabled_at")))
        .order_by("give_up_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
