"""Sending webhook deliveries: signed POSTs, retries with backoff, the attempt log,
disabling an endpoint that keeps failing, and redelivery (SPEC 8, docs/WEBHOOKS.md).

Per endpoint, deliveries go one at a time in event order: the dispatcher takes the
endpoint's dispatch lock (webhooks.locks) and sends its oldest pending delivery; only a
2xx lets it go on to the next one. A delivery whose event is not yet before every
unpublished outbox event waits, so a relay that published later events cannot overtake
one still publishing earlier ones.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, DateTimeField, F, PositiveSmallIntegerField, Q, QuerySet, Subquery, When
from django.db.models.functions import Cast
from django.utils import timezone

from payments.models import OutboxEvent
from payments.relaykick import outbox_relay_kick_on_commit
from webhooks import metrics
from webhooks.errors import WebhookDeliveryNotRedeliverable, WebhookTargetRefused
from webhooks.locks import endpoint_dispatch_lock, webhook_delivery_lock
from webhooks.models import (
    WebhookDelivery,
    WebhookDeliveryAttempt,
    WebhookDeliveryStatus,
    WebhookEndpoint,
    WebhookEndpointStatus,
)
from webhooks.services.endpoints import webhook_endpoint_signing_secrets
from webhooks.signing import SIGNATURE_HEADER, signature_header
from webhooks.targets import webhook_target_resolve
from webhooks.transport import WebhookConnections

logger = logging.getLogger(__name__)

# Retries: attempt n failing waits min(30 s x 2^(n-1), 6 h), jittered to 50-100 % of it,
# until 3 days after the delivery was made (or redelivered); then the delivery fails and
# its endpoint is disabled. That is ~20 attempts: 30 s, 1, 2, 4 ... 256 min, then every 6 h.
RETRY_WINDOW = timedelta(days=3)
RETRY_BASE_SECONDS = 30.0
RETRY_CAP_SECONDS = 6 * 3600.0
USER_AGENT = "Tally-Webhooks/1.0"


def retry_delay(*, attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt: exponential, capped, jittered."""
    delay = min(RETRY_BASE_SECONDS * 2 ** max(attempts - 1, 0), RETRY_CAP_SECONDS)
    return timedelta(seconds=delay * random.uniform(0.5, 1.0))


def webhook_event_body(*, event: OutboxEvent) -> bytes:
    """The JSON body of an event, identical on every attempt (consumers dedupe on `id`)."""
    body = {
        "id": event.id, "object": "event", "type": event.topic, "created": int(event.created.timestamp()),
        "data": {"object": event.payload},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# A drain reads an endpoint's pending deliveries this many at a time, in event order, and
# reads again once a page is this old (a slow endpoint: a page could otherwise last minutes).
DRAIN_PAGE_SIZE = 20
PAGE_FRESH_SECONDS = 1.0


def _pending_page_statement(endpoint_id: str) -> QuerySet[WebhookDelivery]:
    """The endpoint's next pending deliveries in event order, each carrying the watermark:
    (created, id) of the oldest unpublished live outbox event, read in the same statement
    (`watermark_created`, `watermark_id`; None when every event is published)."""
    live = OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True).order_by("created", "id")
    return (
        WebhookDelivery.objects.select_related("endpoint", "event")
        .filter(endpoint_id=endpoint_id, status=WebhookDeliveryStatus.PENDING)
        .annotate(watermark_created=Subquery(live.values("created")[:1]), watermark_id=Subquery(live.values("id")[:1]))
        .order_by("event_created", "event_id")[:DRAIN_PAGE_SIZE]
    )


def _pending_page(*, endpoint_id: str) -> list[WebhookDelivery]:
    return list(_pending_page_statement(endpoint_id))


def webhook_deliveries_dispatch(*, now: datetime | None = None, time_budget_seconds: float = 60.0) -> int:
    """Send every due delivery of every enabled endpoint whose dispatch lock is free; return
    the number of attempts made. `now` (tests) says which retries are due.

    Locks: per endpoint, `endpoint_dispatch_lock` (tried; a busy endpoint is another
    relay's). No row lock is held across an HTTP call; a drain records its outcomes a page at
    a time (`_endpoint_drain`).
    """
    deadline = time.monotonic() + time_budget_seconds
    due_at = now or timezone.now()
    endpoint_ids = list(
        WebhookDelivery.objects.filter(
            status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=due_at, endpoint__status=WebhookEndpointStatus.ENABLED
        ).order_by("endpoint_id").values_list("endpoint_id", flat=True).distinct()  # no default ordering: it would join the DISTINCT
    )
    attempts = 0
    for endpoint_id in endpoint_ids:
        if time.monotonic() > deadline:
            break
        with endpoint_dispatch_lock(endpoint_id=endpoint_id) as taken:
            if taken:
                attempts += _endpoint_drain(endpoint_id=endpoint_id, now=now, deadline=deadline)
    return attempts


def _endpoint_drain(*, endpoint_id: str, now: datetime | None, deadline: float) -> int:
    """Send one endpoint's pending deliveries in event order, stopping at the first that is
    not due or fails. Caller holds the endpoint's dispatch lock, so nobody else sends or
    records this endpoint's deliveries meanwhile.

    Reads a page at a time (one statement with the watermark in it, instead of two per
    delivery), and records the page's outcomes together: one transaction, one INSERT of
    attempts and one UPDATE of the delivered, before the next read or when the drain ends.
    A page is used for PAGE_FRESH_SECONDS at most, then read again, so what a page read
    cannot see lasts about as long as one slow delivery did before: the endpoint
    disabled, its URL changed or its secret rotated (the page holds the endpoint as read),
    an older delivery redelivered (it goes at the next read), and an event committed after
    the read with an older `created` (among transactions still open, order is by `created`
    only as far as they have committed, page or not).
    """
    attempts = 0
    unrecorded: list[_Outcome] = []
    connections = WebhookConnections()
    try:
        while time.monotonic() <= deadline:
            # Pages until one comes back empty, so deliveries made while a page was being
            # sent go in this drain (another relay that made them found the lock taken).
            # What was sent is recorded first: a read must not find it still pending. The
            # list is handed over before recording, so a failure while recording (even one
            # striking after the COMMIT) never has it recorded twice by the `finally`: a
            # batch whose record failed is sent again, at least once.
            batch, unrecorded = unrecorded, []
            _outcomes_record(batch)
            page = _pending_page(endpoint_id=endpoint_id)
            if not page:
                return attempts
            stale_at = time.monotonic() + PAGE_FRESH_SECONDS
            for sent, head in enumerate(page):
                if sent and time.monotonic() > stale_at:
                    break  # read again: the endpoint, the watermark and the order as they are now
                moment = now or timezone.now()
                if head.endpoint.status != WebhookEndpointStatus.ENABLED or head.next_attempt_at > moment:
                    return attempts
                watermark = head.watermark_created, head.watermark_id  # type: ignore[attr-defined]  # annotations
                if watermark[0] is not None and (head.event_created, head.event_id) >= watermark:
                    return attempts
                attempts += 1
                outcome = _delivery_send(delivery=head, now=moment, connections=connections)
                unrecorded.append(outcome)
                if not outcome.succeeded or time.monotonic() > deadline:
                    return attempts
        return attempts
    finally:
        # Also when the task is cut short (a soft time limit strikes in an HTTP call): what
        # was sent is recorded. A process killed outright, or a record that fails, leaves
        # what was sent since the last record (up to a page) to be sent again: at least
        # once, as a crash between a send and its record always did (receivers dedupe by
        # event id).
        try:
            batch, unrecorded = unrecorded, []
            _outcomes_record(batch)
        finally:
            connections.close()


@dataclass(frozen=True)
class _Outcome:
    """One attempt, sent and not yet recorded."""

    delivery: WebhookDelivery
    attempted_at: datetime
    status_code: int | None
    latency_ms: int
    address: str
    excerpt: str
    error: str

    @property
    def succeeded(self) -> bool:
        return not self.error


def _delivery_send(*, delivery: WebhookDelivery, now: datetime, connections: WebhookConnections) -> _Outcome:
    """POST one delivery and log it. The target is checked again (SSRF) against what the
    host resolves to now, and the connection goes to the checked address (the drain's kept
    one only if it goes there too). Records nothing: the caller passes the outcome to
    `_outcomes_record`. Locks: none."""
    endpoint = delivery.endpoint
    body = webhook_event_body(event=delivery.event)
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(secrets=webhook_endpoint_signing_secrets(endpoint=endpoint), timestamp=timestamp, body=body),
    }
    status_code: int | None = None
    excerpt = error = address = ""
    reason = ""
    started = time.monotonic()
    try:
        target = webhook_target_resolve(url=endpoint.url)
        assert target is not None  # unresolvable names raise here
        address = target.address
        answer = connections.post(target=target, body=body, headers=headers)
        status_code, excerpt = answer.status, answer.excerpt
        if not 200 <= answer.status < 300:
            error, reason = f"HTTP {answer.status}", "http_status"
    except WebhookTargetRefused as exc:
        error, reason = f"refused: {exc.message}", "refused"
    except (OSError, http.client.HTTPException) as exc:
        error, reason = f"{type(exc).__name__}: {exc}"[:500], "network"
    latency = time.monotonic() - started
    metrics.WEBHOOK_LATENCY_SECONDS.observe(latency)
    if error:
        metrics.WEBHOOK_FAILURES.labels(reason=reason).inc()
    logger.info(
        "webhook attempt",
        extra={"delivery": delivery.id, "endpoint": endpoint.id, "event": delivery.event_id, "status_code": status_code,
               "latency_ms": int(latency * 1000), "succeeded": not error, "error": error},
    )
    return _Outcome(
        delivery=delivery, attempted_at=now, status_code=status_code, latency_ms=int(latency * 1000), address=address,
        excerpt=excerpt, error=error,
    )


def _delivered_rows(
    pks: Sequence[Any], times: Sequence[Any], codes: Sequence[Any]
) -> tuple[QuerySet[WebhookDelivery], dict[str, Any]]:
    """The UPDATE of delivered deliveries (as a queryset and its update values): each row
    gets its own attempt's time and status code."""

    def per_row(values: Sequence[Any], output_field: Any) -> Cast:
        # Cast, as Django's bulk_update does on PostgreSQL: a CASE of bound parameters has
        # no type of its own under server-side binding.
        return Cast(Case(*[When(pk=pk, then=value) for pk, value in zip(pks, values, strict=True)], output_field=output_field), output_field)

    matches = Q()
    for pk in pks:
        matches |= Q(pk=pk)
    return WebhookDelivery.objects.filter(matches), {
        "attempts": F("attempts") + 1, "last_attempt_at": per_row(times, DateTimeField()), "delivered_at": per_row(times, DateTimeField()),
        "last_status_code": per_row(codes, PositiveSmallIntegerField()), "last_error": "", "status": WebhookDeliveryStatus.SUCCEEDED,
    }


def _outcomes_record(outcomes: Sequence[_Outcome]) -> None:
    """Record sent attempts in one transaction: their attempt rows (one INSERT), the
    delivered deliveries (one UPDATE), and what follows each failure; count them once it
    has committed. Locks: none (the caller holds the endpoint's dispatch lock: nobody else
    records its deliveries)."""
    if not outcomes:
        return
    with transaction.atomic():
        WebhookDeliveryAttempt.objects.bulk_create(
            [
                WebhookDeliveryAttempt(
                    delivery=o.delivery, attempted_at=o.attempted_at, succeeded=o.succeeded, status_code=o.status_code,
                    latency_ms=o.latency_ms, address=o.address, response_excerpt=o.excerpt, error=o.error,
                )
                for o in outcomes
            ]
        )
        delivered = [o for o in outcomes if o.succeeded]
        if delivered:
            rows, update = _delivered_rows(
                [o.delivery.pk for o in delivered], [o.attempted_at for o in delivered], [o.status_code for o in delivered]
            )
            rows.update(**update)
        failures = [(o, _failure_record(o)) for o in outcomes if not o.succeeded]
    if delivered:
        metrics.WEBHOOK_DELIVERIES.labels(outcome="succeeded").inc(len(delivered))
    for outcome, (label, disabled) in failures:
        metrics.WEBHOOK_DELIVERIES.labels(outcome=label).inc()
        if disabled:
            metrics.WEBHOOK_ENDPOINTS_DISABLED.inc()
            logger.warning("webhook endpoint disabled", extra={"endpoint": outcome.delivery.endpoint_id, "error": outcome.error})


def _failure_record(outcome: _Outcome) -> tuple[str, bool]:
    """Schedule the retry of a failed attempt, or give up (and disable the endpoint); return
    the outcome's metric label and whether the endpoint was disabled."""
    delivery, now, error = outcome.delivery, outcome.attempted_at, outcome.error
    fields = {"attempts": F("attempts") + 1, "last_attempt_at": now, "last_status_code": outcome.status_code, "last_error": error}
    following = now + retry_delay(attempts=delivery.attempts + 1)
    if following <= delivery.give_up_at:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(**fields, next_attempt_at=following)
        return "retrying", False
    WebhookDelivery.objects.filter(pk=delivery.pk).update(**fields, status=WebhookDeliveryStatus.FAILED)
    # Nothing got through to this endpoint for the whole window (its deliveries go in
    # order, so this one blocked the rest): stop sending, and say why.
    disabled = WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, status=WebhookEndpointStatus.ENABLED).update(
        status=WebhookEndpointStatus.DISABLED,
        disabled_reason=f"Disabled {now:%Y-%m-%d %H:%M} UTC: delivery {delivery.id} failed for {RETRY_WINDOW.days} days ({error})"[:500],
        updated=now,
    )
    return "gave_up", bool(disabled)


@transaction.atomic
def webhook_delivery_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """Send a delivery again: it becomes pending, due now, with a fresh 3-day retry window.

    Its endpoint must be enabled (re-enable it first). It goes out in event order with the
    endpoint's other pending deliveries (an old event therefore goes first, from the
    dispatcher's next read: within PAGE_FRESH_SECONDS of a page in flight). Locks: the
    delivery row (FOR UPDATE). The relay is kicked after commit.
    """
    locked = webhook_delivery_lock(delivery_id=delivery.pk)
    if locked.endpoint.status != WebhookEndpointStatus.ENABLED:
        raise WebhookDeliveryNotRedeliverable("the webhook endpoint is disabled; enable it first", param="delivery")
    if locked.status != WebhookDeliveryStatus.PENDING:
        now = timezone.now()
        locked.status = WebhookDeliveryStatus.PENDING
        locked.next_attempt_at = now
        locked.give_up_at = now + RETRY_WINDOW
        locked.save(update_fields=["status", "next_attempt_at", "give_up_at"])
    else:  # already pending: just make it due now
        locked.next_attempt_at = timezone.now()
        locked.save(update_fields=["next_attempt_at"])
    outbox_relay_kick_on_commit()
    return locked
