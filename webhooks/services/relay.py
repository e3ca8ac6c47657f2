"""The outbox relay (SPEC 8): publish committed `OutboxEvent` rows into webhook deliveries,
then send them (docs/WEBHOOKS.md "Publish" and "Deliver")."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from payments.models import OutboxEvent
from payments.relaykick import outbox_relay_kick_on_commit, outbox_relay_kick_pending_clear
from tenants.duework import due_work_settle
from tenants.models import DueWorkKind
from webhooks import metrics
from webhooks.locks import outbox_event_lock, outbox_events_claim
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.selectors import relay_work_next_due_at
from webhooks.services.deliveries import RETRY_WINDOW, webhook_deliveries_dispatch, webhook_waiting_deliveries_expire

logger = logging.getLogger(__name__)

RELAY_BATCH_SIZE = 100
RELAY_MAX_BATCHES = 50
OUTBOX_MAX_ATTEMPTS = 8
OUTBOX_RETRY_BASE_SECONDS = 5.0
OUTBOX_RETRY_CAP_SECONDS = 600.0
# While a relay sends deliveries, it publishes newly committed events this often.
PUBLISH_EVERY_SECONDS = 0.05


def _merchant_of(event: OutboxEvent) -> str | None:
    merchant = event.payload.get("merchant") if isinstance(event.payload, dict) else None
    return merchant if isinstance(merchant, str) else None


def outbox_batch_publish(*, batch_size: int = RELAY_BATCH_SIZE, now: datetime | None = None) -> tuple[int, int]:
    """Claim and publish one batch; return (claimed, published). Its deliveries go in one INSERT;
    if that fails, each event tries again under its own savepoint (one failing holds back none).
    Locks: the batch's outbox rows (`outbox_events_claim`, SKIP LOCKED), for this one transaction."""
    with transaction.atomic():
        moment = now or timezone.now()
        batch = list(outbox_events_claim(now=moment, limit=batch_size))
        pause = float(getattr(settings, "TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS", 0.0))
        if pause and batch:  # test-only hook: hold the claimed rows (the SIGKILL test kills us here)
            time.sleep(pause)
        merchant_ids = {m for m in map(_merchant_of, batch) if m}
        by_merchant: dict[str, list[WebhookEndpoint]] = defaultdict(list)
        # Disabled endpoints too: their deliveries wait for it to be enabled again (SPEC 8: no event dropped).
        for endpoint in WebhookEndpoint.objects.filter(merchant_id__in=merchant_ids):
            by_merchant[endpoint.merchant_id].append(endpoint)
        published: list[str] = []
        making: list[tuple[OutboxEvent, list[WebhookDelivery]]] = []
        for event in batch:
            deliveries = [
                WebhookDelivery(
                    endpoint=e, event=event, topic=event.topic, event_created=event.created, next_attempt_at=moment,
                    give_up_at=moment + RETRY_WINDOW, created=moment,
                )
                for e in by_merchant.get(_merchant_of(event) or "", [])
                if "*" in e.enabled_events or event.topic in e.enabled_events
            ]
            if deliveries:
                making.append((event, deliveries))
            else:
                published.append(event.pk)  # no delivery to make: nothing that could fail
        # ignore_conflicts: made already by a relay that died after its commit.
        try:
            if making:
                with transaction.atomic():
                    WebhookDelivery.objects.bulk_create([d for _, deliveries in making for d in deliveries], ignore_conflicts=True)
            published.extend(event.pk for event, _ in making)
        except DatabaseError:
            for event, deliveries in making:
                try:
                    with transaction.atomic():
                        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
                    published.append(event.pk)
                except DatabaseError as exc:
                    event.attempts += 1
                    _publication_failed(event=event, error=f"{type(exc).__name__}: {exc}", now=moment)
                    event.save(update_fields=["attempts", "last_error", "next_attempt_at", "dead_at"])
        OutboxEvent.objects.filter(pk__in=published).update(published_at=moment, attempts=F("attempts") + 1, last_error="", next_attempt_at=None)
        metrics.OUTBOX_EVENTS_RELAYED.inc(len(published))
        return len(batch), len(published)


def _publication_failed(*, event: OutboxEvent, error: str, now: datetime) -> None:
    event.last_error = error[:1000]
    metrics.OUTBOX_PUBLISH_FAILURES.inc()
    if event.attempts >= OUTBOX_MAX_ATTEMPTS:
        event.dead_at = now
        metrics.OUTBOX_DEAD_LETTERS.inc()
        logger.error("outbox event dead-lettered", extra={"event": event.id, "error": event.last_error})
    else:
        delay = min(OUTBOX_RETRY_BASE_SECONDS * 2 ** (event.attempts - 1), OUTBOX_RETRY_CAP_SECONDS)
        event.next_attempt_at = now + timedelta(seconds=delay)


def outbox_lag_seconds_refresh(*, now: datetime | None = None) -> float:
    """Set tally_outbox_lag_seconds for this tenant: the age of the oldest unpublished live event."""
    unpublished = OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True)
    oldest = unpublished.order_by("created", "id").values_list("created", flat=True).first()
    lag = max(((now or timezone.now()) - oldest).total_seconds(), 0.0) if oldest else 0.0
    metrics.OUTBOX_LAG_SECONDS.labels(tenant=str(getattr(connection, "schema_name", "public"))).set(lag)
    return lag


def outbox_relay_run(
    *, now: datetime | None = None, batch_size: int = RELAY_BATCH_SIZE, max_batches: int = RELAY_MAX_BATCHES, kick_token: str = "",
    settle: bool = False,
) -> int:
    """The relay, in the current tenant: publish due events, refresh the lag gauge, then send
    due deliveries (publishing what commits meanwhile) until none is due or the budget is
    spent; return the events published. `kick_token`: the kick that sent it. `settle` (beat's
    runs): first expire the deliveries that waited out their window, and at the end record
    when the tenant's relay work is next due; kicked runs leave both to beat's, so a busy
    tenant's due-work row is not rewritten at every commit.

    Locks: those of `outbox_batch_publish`, then `webhook_deliveries_dispatch`; settling, the relay due-work lock (tried)."""
    # Before the first read: a commit that sees no kick pending after this point sends one.
    outbox_relay_kick_pending_clear(schema_name=str(getattr(connection, "schema_name", "public")), kick_token=kick_token)
    published = 0
    if settle:
        webhook_waiting_deliveries_expire(now=now)
    for _ in range(max_batches):
        claimed, count = outbox_batch_publish(batch_size=batch_size, now=now)
        published += count
        if claimed < batch_size:
            break
    outbox_lag_seconds_refresh(now=now)
    published_meanwhile = 0
    next_publish = time.monotonic() + PUBLISH_EVERY_SECONDS

    def publish_meanwhile() -> None:
        # A dispatch can last seconds: events committed meanwhile do not wait for its end.
        nonlocal published_meanwhile, next_publish
        if time.monotonic() >= next_publish:
            next_publish = time.monotonic() + PUBLISH_EVERY_SECONDS
            published_meanwhile += outbox_batch_publish(batch_size=batch_size, now=now)[1]

    webhook_deliveries_dispatch(now=now, publish=publish_meanwhile)
    if settle:
        relay_due_settle()
    return published + published_meanwhile


def relay_due_settle() -> bool:
    """The tenant's relay due-work rows say when it next has work, or go.
    Locks: the tenant's relay due-work lock, EXCLUSIVE, tried (tenants.duework)."""
    return due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=lambda: relay_work_next_due_at(now=timezone.now()))


@transaction.atomic
def outbox_event_requeue(*, event: OutboxEvent) -> OutboxEvent:
    """Give a dead letter (or a row waiting for its next attempt) another round now.
    Locks: the outbox row (FOR UPDATE). The relay is kicked after commit."""
    locked = outbox_event_lock(event_id=event.pk)
    if locked.published_at is None:
        locked.dead_at, locked.next_attempt_at, locked.attempts = None, None, 0
        locked.save(update_fields=["dead_at", "next_attempt_at", "attempts"])
        outbox_relay_kick_on_commit()
    return locked
