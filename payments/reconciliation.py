"""Reconciliation checks on the payments layer's data (see wallets.reconciliation for the
contract): duplicate-charge suspects, stuck in-flight idempotency keys, outbox lag and dead
letters; and the per-run metrics the dashboard charts across runs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db.models import Count, F, Min, Window
from django.db.models.functions import Lag
from prometheus_client import Counter

from payments.idempotency import metrics as idempotency_metrics
from payments.idempotency.models import IdempotencyRecord, RecordState
from payments.models import OutboxEvent, Payment
from wallets.reconciliation import CheckContext, Discrepancy, ObjectRef, Severity


def duplicate_charges_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Duplicate-charge suspects: a payment by the same customer to the same merchant for the
    same amount (and asset) within `duplicate_window_seconds` of the previous one. One
    window function over the payments, streamed; each suspect names both payments."""
    window: dict[str, Any] = {
        "partition_by": [F("customer_id"), F("merchant_id"), F("asset_id"), F("amount")],
        "order_by": [F("created").asc(), F("id").asc()],
    }
    suspects = (
        Payment.objects.order_by()
        .annotate(previous_id=Window(Lag("id"), **window), previous_created=Window(Lag("created"), **window))
        .filter(previous_created__isnull=False, created__lte=F("previous_created") + timedelta(seconds=ctx.duplicate_window_seconds))
        .values_list("id", "previous_id", "customer_id", "merchant_id", "asset_id", "amount", "amount_refunded", "created", "previous_created")
        .order_by("created", "id")
    )
    for pay_id, previous_id, customer, merchant, asset, amount, refunded, created, previous_created in suspects.iterator(chunk_size=ctx.chunk_size):
        seconds = (created - previous_created).total_seconds()
        yield Discrepancy(
            kind="duplicate_charge_suspect",
            severity=Severity.WARNING,
            summary=f"{pay_id} charged {customer} {amount} {asset} at {merchant} {seconds:.0f} s after {previous_id}",
            details={"payment": pay_id, "previous_payment": previous_id, "customer": customer, "merchant": merchant, "asset": asset,
                     "amount": int(amount), "amount_refunded": int(refunded), "seconds_apart": seconds,
                     "created": created.isoformat(), "previous_created": previous_created.isoformat()},
            refs=(ObjectRef("payments", "payment", pay_id), ObjectRef("payments", "payment", str(previous_id)),
                  ObjectRef("wallets", "customer", customer), ObjectRef("wallets", "merchant", merchant)),
        )
    ctx.stats["payments"] = Payment.objects.count()


def idempotency_stuck_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """In-flight idempotency records whose lease has expired (the predicate of
    `idempotency_orphans_list`, streamed rather than limited): a request that crashed
    between its claim and its completion, which the orphan recovery has not taken over."""
    stuck = IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, lease_expires_at__lte=ctx.now).order_by("lease_expires_at", "id")
    for record in stuck.iterator(chunk_size=ctx.chunk_size):
        assert record.lease_expires_at is not None
        stuck_for = (ctx.now - record.lease_expires_at).total_seconds()
        yield Discrepancy(
            kind="idempotency_stuck_in_flight",
            severity=Severity.WARNING,
            summary=f"key {record.key!r} of {record.principal_id} ({record.scope}) in flight, lease expired {stuck_for:.0f} s ago",
            details={"principal_id": record.principal_id, "key": record.key, "scope": record.scope, "effect": record.effect,
                     "fence": record.fence, "request_id": record.request_id, "method": record.method, "path": record.path,
                     "lease_expires_at": record.lease_expires_at.isoformat(), "stuck_seconds": stuck_for, "minted": record.minted,
                     "claimed": record.created.isoformat()},
            refs=(ObjectRef("idempotency", "idempotencyrecord", str(record.pk)),),
        )


def outbox_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Outbox lag (the oldest live unpublished event older than the threshold: one finding
    with the backlog) and dead letters (one finding each)."""
    live = OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True)
    backlog = live.aggregate(count=Count("id"), oldest=Min("created"))
    oldest = backlog["oldest"]
    lag = max((ctx.now - oldest).total_seconds(), 0.0) if oldest else 0.0
    ctx.stats.update(unpublished=int(backlog["count"]), lag_seconds=lag)
    if oldest is not None and lag > ctx.outbox_lag_threshold_seconds:
        first = live.order_by("created", "id").values_list("id", "topic", "attempts", "last_error").first()
        assert first is not None
        yield Discrepancy(
            kind="outbox_lag",
            severity=Severity.WARNING,
            summary=f"{backlog['count']} outbox event(s) unpublished, the oldest ({first[0]}) for {lag:.0f} s",
            details={"unpublished": int(backlog["count"]), "lag_seconds": lag, "threshold_seconds": ctx.outbox_lag_threshold_seconds,
                     "oldest_event": first[0], "oldest_topic": first[1], "oldest_attempts": first[2], "oldest_last_error": first[3][:500]},
            refs=(ObjectRef("payments", "outboxevent", str(first[0])),),
        )
    dead = OutboxEvent.objects.filter(dead_at__isnull=False, published_at__isnull=True).order_by("dead_at", "id")
    for event in dead.only("id", "topic", "attempts", "last_error", "dead_at", "created").iterator(chunk_size=ctx.chunk_size):
        assert event.dead_at is not None
        yield Discrepancy(
            kind="outbox_dead_letter",
            severity=Severity.WARNING,
            summary=f"outbox event {event.id} ({event.topic}) dead after {event.attempts} attempts: {event.last_error[:120]}",
            details={"event": event.id, "topic": event.topic, "attempts": event.attempts, "last_error": event.last_error[:500],
                     "dead_at": event.dead_at.isoformat(), "created": event.created.isoformat()},
            refs=(ObjectRef("payments", "outboxevent", event.id),),
        )


def _counter_total(counter: Counter) -> float:
    return float(sum(s.value for metric in counter.collect() for s in metric.samples if s.name.endswith("_total")))


def payments_run_metrics(*, ctx: CheckContext) -> dict[str, Any]:
    """What the dashboard charts across runs and nothing else stores over time: the
    outbox backlog and lag, the idempotency records by state, and the idempotency
    counters of this process (Prometheus counters are per process and carry no tenant:
    the chart shows their increase between runs)."""
    live = OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True).aggregate(count=Count("id"), oldest=Min("created"))
    oldest = live["oldest"]
    states = dict(IdempotencyRecord.objects.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return {
        "outbox_unpublished": int(live["count"]),
        "outbox_lag_seconds": max((ctx.now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        "outbox_dead_letters": OutboxEvent.objects.filter(dead_at__isnull=False, published_at__isnull=True).count(),
        "idempotency_in_flight": int(states.get(RecordState.IN_FLIGHT, 0)),
        "idempotency_completed": int(states.get(RecordState.COMPLETED, 0)),
        "idempotency_failed_retryable": int(states.get(RecordState.FAILED_RETRYABLE, 0)),
        "idempotency_stuck": IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, lease_expires_at__lte=ctx.now).count(),
        "process_idempotency_replays_total": _counter_total(idempotency_metrics.IDEMPOTENCY_REPLAYS),
        "process_idempotency_conflicts_total": _counter_total(idempotency_metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS)
        + _counter_total(idempotency_metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES),
    }
