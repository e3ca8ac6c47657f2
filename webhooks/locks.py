"""Every lock the webhooks app takes, named (the money locks: wallets/locks.py), and the
delivery loop's lease and record writes. The loop's statements are compiled once per shape
and process (fastpath.compiled): Django compiling them on every round cost more than the
rest of a delivery (docs/BENCHMARKS.md "Webhook deliveries").

Order: an endpoint's row before its delivery rows, always; never with a money lock; none
across an HTTP call. (A give-up takes its endpoint's row SKIP LOCKED after the delivery:
it never waits for it.) Endpoint rows are FOR NO KEY UPDATE (a delivery's insert is not
blocked); in a claim, the endpoint row makes "count in flight, then lease up to the cap" one step."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, DateTimeField, F, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from fastpath.compiled import CompiledQuery, CompiledShapes, Param, rows_insert
from payments.models import OutboxEvent
from wallets.models import Merchant
from webhooks.models import WebhookDelivery, WebhookDeliveryAttempt, WebhookDeliveryStatus, WebhookEndpoint, WebhookEndpointStatus


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


_NOW = Param("now", output_field=DateTimeField())


def _with_in_flight(endpoints: QuerySet[WebhookEndpoint]) -> QuerySet[WebhookEndpoint]:
    """`endpoints` enabled and below their `cap` of `in_flight` (leased past `now`), locked SKIP LOCKED."""
    in_flight = _pending().filter(leased_until__gt=_NOW).order_by().values("endpoint").annotate(n=Count("pk")).values("n")
    return (
        endpoints.select_for_update(no_key=True, skip_locked=True, of=("self",))
        .filter(status=WebhookEndpointStatus.ENABLED)
        .annotate(
            in_flight=Coalesce(Subquery(in_flight, output_field=IntegerField()), 0),
            cap=Coalesce("max_concurrency", Param("default_cap", output_field=IntegerField()), output_field=IntegerField()),
        )
        .filter(in_flight__lt=F("cap"))
    )


def _endpoints_due_statement(limit: int) -> CompiledQuery[WebhookEndpoint]:
    due = _pending().filter(next_attempt_at__lte=_NOW).order_by("next_attempt_at").values("next_attempt_at")[:1]
    endpoints = _with_in_flight(WebhookEndpoint.objects.all()).annotate(oldest_due=Subquery(due)).filter(oldest_due__isnull=False)
    return CompiledQuery(endpoints.order_by("oldest_due", "pk")[:limit], prepared=True)


def _endpoints_statement(count: int) -> CompiledQuery[WebhookEndpoint]:
    endpoints = WebhookEndpoint.objects.filter(pk__in=[Param(f"endpoint{i}") for i in range(count)])
    return CompiledQuery(_with_in_flight(endpoints).order_by("pk"), prepared=True)


def _deliveries_due_statement(limit: int) -> CompiledQuery[WebhookDelivery]:
    due = (
        WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("event")
        .filter(endpoint_id=Param("endpoint"), status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=_NOW)
        .order_by("next_attempt_at", "pk")
    )
    return CompiledQuery(due[:limit], prepared=True)


def _ids(count: int) -> dict[str, Any]:
    return {"pk__in": [Param(f"row{i}") for i in range(count)]}


def _lease_statement(count: int) -> CompiledQuery[WebhookDelivery]:
    lease = Param("lease", output_field=DateTimeField())
    return CompiledQuery(WebhookDelivery.objects.filter(**_ids(count)), update={"next_attempt_at": lease, "leased_until": lease}, prepared=True)


def _delivered_statement(count: int) -> CompiledQuery[WebhookDelivery]:
    # Only rows still pending: a delivery sent twice (its lease ran out) is delivered once.
    at = Param("at", output_field=DateTimeField())
    return CompiledQuery(
        WebhookDelivery.objects.filter(**_ids(count), status=WebhookDeliveryStatus.PENDING),
        update={
            "attempts": F("attempts") + 1, "last_attempt_at": at, "delivered_at": at,
            "last_status_code": Param("status_code", output_field=IntegerField()), "last_error": "",
            "status": WebhookDeliveryStatus.SUCCEEDED, "leased_until": None,
        },
        prepared=True,
    )


_ENDPOINTS_DUE: CompiledShapes[WebhookEndpoint] = CompiledShapes(_endpoints_due_statement)
_ENDPOINTS: CompiledShapes[WebhookEndpoint] = CompiledShapes(_endpoints_statement)
_DELIVERIES_DUE: CompiledShapes[WebhookDelivery] = CompiledShapes(_deliveries_due_statement)
_LEASE: CompiledShapes[WebhookDelivery] = CompiledShapes(_lease_statement)
_DELIVERED: CompiledShapes[WebhookDelivery] = CompiledShapes(_delivered_statement)


def _rows(ids: Sequence[str]) -> dict[str, str]:
    return {f"row{i}": pk for i, pk in enumerate(ids)}


def webhook_endpoints_due_lock(*, now: datetime, limit: int) -> list[WebhookEndpoint]:
    """Up to `limit` of `_with_in_flight` with a delivery due at `now`, the one whose oldest due delivery is oldest first."""
    return _ENDPOINTS_DUE.get(limit).select(now=now, default_cap=int(settings.TALLY_WEBHOOK_ENDPOINT_CONCURRENCY))


def webhook_endpoints_lock(*, endpoint_ids: Sequence[str], now: datetime) -> list[WebhookEndpoint]:
    """These endpoints (a refill: answers just came back) of `_with_in_flight`, in id order."""
    ids = sorted(set(endpoint_ids))
    values = {f"endpoint{i}": pk for i, pk in enumerate(ids)}
    return _ENDPOINTS.get(len(ids)).select(now=now, default_cap=int(settings.TALLY_WEBHOOK_ENDPOINT_CONCURRENCY), **values)


def webhook_deliveries_due_lock(*, endpoint_id: str, now: datetime, limit: int) -> list[WebhookDelivery]:
    """Up to `limit` of the endpoint's deliveries due at `now`, oldest due first, with their
    events, locked SKIP LOCKED. The caller holds the endpoint's row."""
    return _DELIVERIES_DUE.get(limit).select(endpoint=endpoint_id, now=now)


def webhook_deliveries_lease(*, delivery_ids: Sequence[str], lease: datetime) -> int:
    """Lease claimed deliveries until `lease` (also when they are next due, should the lease
    run out). Locks: none of its own (the caller holds the rows: `webhook_deliveries_due_lock`)."""
    return _LEASE.get(len(delivery_ids)).update(lease=lease, **_rows(delivery_ids)) if delivery_ids else 0


def webhook_deliveries_delivered(*, delivery_ids: Sequence[str], at: datetime, status_code: int | None) -> int:
    """Record deliveries whose attempt at `at` was answered `status_code` (a 2xx) as succeeded,
    those still pending. Locks: the rows it updates."""
    return _DELIVERED.get(len(delivery_ids)).update(at=at, status_code=status_code, **_rows(delivery_ids)) if delivery_ids else 0


def webhook_attempts_insert(*, attempts: Sequence[WebhookDeliveryAttempt]) -> None:
    """The attempt log's new rows, in one statement. Locks: none (new rows)."""
    rows_insert(attempts)


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
