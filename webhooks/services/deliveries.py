"""Sending webhook deliveries: signed POSTs, retries with backoff, the attempt log,
disabling an endpoint that keeps failing, and redelivery (SPEC 8). Claim, send, record,
the caps and why it is at least once: docs/WEBHOOKS.md "Deliver"."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, CharField, F, Q, QuerySet, Value, When
from django.utils import timezone

from payments.models import OutboxEvent
from payments.relaykick import outbox_relay_kick_on_commit
from webhooks import metrics
from webhooks.errors import WebhookDeliveryNotRedeliverable, WebhookTargetRefused
from webhooks.locks import (
    webhook_attempts_insert,
    webhook_deliveries_delivered,
    webhook_deliveries_due_lock,
    webhook_deliveries_lease,
    webhook_deliveries_waited_out_lock,
    webhook_endpoint_then_delivery_lock,
    webhook_endpoints_due_lock,
    webhook_endpoints_lock,
)
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
from webhooks.transport import KEPT_IDLE_SECONDS, SEND_ERRORS, WebhookConnections

logger = logging.getLogger(__name__)

# The schedule: docs/WEBHOOKS.md "Retries". The quick first retry is for blips (a reset kept connection, a restart):
# a request that went is never resent at once (the receiver may have taken it), so without it a blip costs 15-30 s.
RETRY_WINDOW = timedelta(days=3)
RETRY_FIRST_SECONDS = 2.0
RETRY_BASE_SECONDS = 30.0
RETRY_CAP_SECONDS = 6 * 3600.0
USER_AGENT = "Tally-Webhooks/1.0"
# What the merchant sees for a target the SSRF check refused, whatever the reason.
REFUSED_ERROR = "refused: url not allowed"

# What an expired delivery that was never attempted says (one attempted keeps its last error).
EXPIRED_ERROR = "expired: the endpoint was disabled until after this delivery's retry window closed"
EXPIRE_BATCH = 500
EXPIRE_MAX_BATCHES = 20

CLAIM_ENDPOINTS = 64  # a claim's endpoints at a time
# While requests are in flight, the dispatcher also looks for new due work this often.
POLL_SECONDS = 0.1
# Once one answer is back, how long the dispatcher waits for the rest in flight before it
# records them: a round (one transaction) then records and refills many slots, not one.
GATHER_SECONDS = 0.01


def retry_delay(*, attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt."""
    delay = RETRY_FIRST_SECONDS if attempts <= 1 else min(RETRY_BASE_SECONDS * 2 ** (attempts - 2), RETRY_CAP_SECONDS)
    return timedelta(seconds=delay * random.uniform(0.5, 1.0))


def webhook_event_body(*, event: OutboxEvent) -> bytes:
    """The JSON body of an event, identical on every attempt (docs/WEBHOOKS.md "A delivery")."""
    body = {
        "id": event.id, "object": "event", "type": event.topic, "created": int(event.created.timestamp()),
        "sequence": event.sequence, "data": {"object": event.payload},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _process_concurrency() -> int:
    return max(1, int(settings.TALLY_WEBHOOK_PROCESS_CONCURRENCY))


class _Senders:
    """The process's one thread pool for sends (its threads start on first use), its slots and
    its kept connections, shared by every dispatch: a dispatch claims only as many deliveries
    as it took slots, so a leased delivery never waits for a thread; and a run's requests go on
    the connections the runs before it kept (a TCP and TLS handshake per connection, not per run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used = 0
        self._executor = ThreadPoolExecutor(max_workers=_process_concurrency(), thread_name_prefix="webhook-send")
        # Up to one per request in flight to a target: as many as the process sends at once.
        self.connections = WebhookConnections(per_target=_process_concurrency())
        self._reaper: threading.Thread | None = None

    def reaper_start(self) -> None:
        """Close idle targets' connections every KEPT_IDLE_SECONDS, from a thread of the process's
        own: a worker that stops getting relay runs does not keep sockets its receivers closed."""
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="webhook-kept-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(KEPT_IDLE_SECONDS)
            try:
                self.connections.idle_close()
            except Exception:  # a failed pass leaves them to the next
                logger.exception("closing idle webhook connections failed")

    def take(self, wanted: int) -> int:
        with self._lock:
            granted = max(0, min(wanted, _process_concurrency() - self._used))
            self._used += granted
            return granted

    def give(self, count: int) -> None:
        with self._lock:
            self._used -= count

    def submit(self, claim: _Claim, connections: WebhookConnections) -> Future[_Outcome]:
        return self._executor.submit(_sent_safely, claim, connections)


_SENDERS = _Senders()


def _senders_renew() -> None:
    """A forked child (a prefork worker) has neither the parent's threads nor its requests in
    flight, and must not share its sockets."""
    global _SENDERS
    _SENDERS = _Senders()


def webhook_kept_connections_close() -> None:
    """Close every connection this process keeps to webhook receivers (the tests, between them)."""
    _SENDERS.connections.clear()


os.register_at_fork(after_in_child=_senders_renew)


@dataclass(frozen=True)
class _Claim:
    """A leased delivery, signed by the dispatching thread (unsealing reads the database)."""

    delivery: WebhookDelivery
    endpoint: WebhookEndpoint
    lease: datetime
    attempted_at: datetime
    body: bytes
    headers: dict[str, str]
    unsendable: str = ""  # why the body or signature could not be made: fails this one alone


@dataclass(frozen=True)
class _Outcome:
    """One attempt, sent and not yet recorded."""

    claim: _Claim
    status_code: int | None
    latency_ms: int
    address: str
    excerpt: str
    error: str  # the attempt log's (staff only) and the log line's: says why a target was refused
    refused: bool = False

    @property
    def shown_error(self) -> str:
        """The error the merchant reads (the delivery's `last_error`, the endpoint's
        `disabled_reason`): one text for every refusal, so it cannot map our internal DNS."""
        return REFUSED_ERROR if self.refused else self.error

    @property
    def attempted_at(self) -> datetime:
        return self.claim.attempted_at

    @property
    def succeeded(self) -> bool:
        return not self.error


def _deliveries_claim(*, now: datetime, limit: int, refill: Mapping[str, int] | None = None) -> tuple[list[_Claim], bool, int]:
    """Lease up to `limit` due deliveries, at most each endpoint's free slots; return them
    signed, whether endpoints with due work were left waiting for want of `limit`, and how
    many it marked `expired` instead (`_waited_out`). With `refill` (endpoint id -> answers
    just back from it), only those endpoints get up to that many again; without it, every
    endpoint is scanned, longest waiting first.

    Locks: `webhook_endpoints_lock` or `webhook_endpoints_due_lock`, then `webhook_deliveries_due_lock` (SKIP LOCKED)."""
    if limit <= 0:
        return [], False, 0
    lease = now + timedelta(seconds=float(settings.TALLY_WEBHOOK_LEASE_SECONDS))
    taken: list[tuple[WebhookDelivery, WebhookEndpoint]] = []
    contended = False
    waited_out: list[str] = []
    with transaction.atomic():
        if refill:
            endpoints = webhook_endpoints_lock(endpoint_ids=list(refill), now=now)
            wanted = {e.pk: refill[e.pk] for e in endpoints}
        else:
            endpoints = webhook_endpoints_due_lock(now=now, limit=CLAIM_ENDPOINTS)
            wanted = {e.pk: limit for e in endpoints}
            contended = len(endpoints) == CLAIM_ENDPOINTS
        for endpoint in endpoints:
            free = min(endpoint.cap - endpoint.in_flight, wanted[endpoint.pk], limit - len(taken))  # type: ignore[attr-defined]  # annotations
            if free <= 0:
                contended = contended or not refill
                continue
            for d in webhook_deliveries_due_lock(endpoint_id=endpoint.pk, now=now, limit=free):
                if _waited_out(delivery=d, endpoint=endpoint):
                    waited_out.append(d.pk)
                else:
                    taken.append((d, endpoint))
        if taken:
            webhook_deliveries_lease(delivery_ids=[d.pk for d, _ in taken], lease=lease)
        if waited_out:
            _expire(WebhookDelivery.objects.filter(pk__in=waited_out))
    return [_claim_prepare(delivery=d, endpoint=e, lease=lease, now=now) for d, e in taken], contended, len(waited_out)


def _waited_out(*, delivery: WebhookDelivery, endpoint: WebhookEndpoint) -> bool:
    """The delivery's window closed before its endpoint was last enabled again: it waited
    it out while the endpoint was disabled, and is not sent (redeliver it to send it)."""
    return endpoint.enabled_at is not None and delivery.give_up_at <= endpoint.enabled_at


def _expire(rows: QuerySet[WebhookDelivery]) -> int:
    """Mark `rows` expired (caller holds them). `last_error` explains only on rows never
    attempted: one that was attempted keeps its last attempt's error."""
    return rows.update(
        status=WebhookDeliveryStatus.EXPIRED, leased_until=None,
        last_error=Case(When(attempts=0, then=Value(EXPIRED_ERROR)), default=F("last_error"), output_field=CharField()),
    )


def webhook_waiting_deliveries_expire(*, now: datetime | None = None, batch_size: int = EXPIRE_BATCH, max_batches: int = EXPIRE_MAX_BATCHES) -> int:
    """The sweep in beat's relay runs (docs/WEBHOOKS.md "No event dropped"): mark `expired` the pending
    deliveries whose window closed while their endpoint was disabled, `batch_size` a transaction, at most
    `max_batches` a run; return how many.
    Locks: per batch, its delivery rows (`webhook_deliveries_waited_out_lock`, SKIP LOCKED)."""
    now = now or timezone.now()
    expired = 0
    for _ in range(max_batches):
        with transaction.atomic():
            ids = webhook_deliveries_waited_out_lock(now=now, limit=batch_size)
            if ids:
                expired += _expire(WebhookDelivery.objects.filter(pk__in=ids))
        if len(ids) < batch_size:
            break
    return expired


def _claim_prepare(*, delivery: WebhookDelivery, endpoint: WebhookEndpoint, lease: datetime, now: datetime) -> _Claim:
    delivery.endpoint = endpoint
    unsendable = ""
    try:
        body = webhook_event_body(event=delivery.event)
        signature = signature_header(secrets=webhook_endpoint_signing_secrets(endpoint=endpoint), timestamp=int(time.time()), body=body)
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, SIGNATURE_HEADER: signature}
    except Exception as exc:  # one endpoint's unreadable secret must not hold back the rest of the batch
        logger.exception("webhook delivery unsendable", extra={"delivery": delivery.id, "endpoint": endpoint.id})
        body, headers, unsendable = b"", {}, f"signing: {type(exc).__name__}"
    return _Claim(delivery=delivery, endpoint=endpoint, lease=lease, attempted_at=now, body=body, headers=headers, unsendable=unsendable)


def _delivery_send(*, claim: _Claim, connections: WebhookConnections) -> _Outcome:
    """POST one claimed delivery (in a sending thread; never touches the database), to the
    address the SSRF check passed for what the host resolves to now."""
    endpoint = claim.endpoint
    if claim.unsendable:  # recorded as a failed attempt, retried on its own schedule
        metrics.WEBHOOK_FAILURES.labels(reason="unsendable").inc()
        return _Outcome(claim=claim, status_code=None, latency_ms=0, address="", excerpt="", error=claim.unsendable)
    status_code: int | None = None
    excerpt = error = address = reason = ""
    refused = False
    started = time.monotonic()
    try:
        target = webhook_target_resolve(url=endpoint.url)
        address = target.address
        answer = connections.post(target=target, body=claim.body, headers=claim.headers)
        status_code, excerpt = answer.status, answer.excerpt
        if not 200 <= answer.status < 300:
            error, reason = f"HTTP {answer.status}", "http_status"
    except WebhookTargetRefused as exc:
        error, reason, refused = f"refused: {exc.message}", "refused", True
    except SEND_ERRORS as exc:
        error, reason = f"{type(exc).__name__}: {exc}"[:500], "network"
    latency = time.monotonic() - started
    metrics.WEBHOOK_LATENCY_SECONDS.observe(latency)
    if error:
        metrics.WEBHOOK_FAILURES.labels(reason=reason).inc()
    # A failed attempt at INFO; a delivered one at DEBUG: its row says the same, and at INFO
    # its line cost a tenth of the delivery's CPU (docs/BENCHMARKS.md "Webhook deliveries").
    logger.log(
        logging.INFO if error else logging.DEBUG,
        "webhook attempt",
        extra={"delivery": claim.delivery.id, "endpoint": endpoint.id, "event": claim.delivery.event_id, "status_code": status_code,
               "latency_ms": int(latency * 1000), "succeeded": not error, "error": error},
    )
    return _Outcome(
        claim=claim, status_code=status_code, latency_ms=int(latency * 1000), address=address, excerpt=_storable(excerpt),
        error=_storable(error), refused=refused,
    )


def _storable(text: str) -> str:
    """`text` with any NUL replaced: PostgreSQL's text refuses it, and one answer carrying one
    (a binary body, an error quoting it) would fail its whole round's record."""
    return text.replace("\x00", "\ufffd")


def _sent_safely(claim: _Claim, connections: WebhookConnections) -> _Outcome:
    try:
        return _delivery_send(claim=claim, connections=connections)
    except Exception as exc:  # a bug in one send must not lose the others' records
        logger.exception("webhook send failed", extra={"delivery": claim.delivery.id})
        return _Outcome(claim=claim, status_code=None, latency_ms=0, address="", excerpt="", error=_storable(f"{type(exc).__name__}: {exc}"[:500]))


def webhook_deliveries_dispatch(
    *, now: datetime | None = None, time_budget_seconds: float | None = None, publish: Callable[[], object] | None = None
) -> int:
    """Send this tenant's due deliveries until none is due or the budget is spent (then claim
    no more, and record what is in flight); return the attempts made. `now` (tests) says which
    are due; `publish` (the relay's) is called between claims. Locks: `_round`'s; none across an HTTP call."""
    budget = float(settings.TALLY_WEBHOOK_DISPATCH_SECONDS) if time_budget_seconds is None else time_budget_seconds
    deadline = time.monotonic() + budget
    # Idle connections are not reused (transport's check) and the reaper closes idle targets.
    connections = _SENDERS.connections
    _SENDERS.reaper_start()
    in_flight: dict[Future[_Outcome], _Claim] = {}
    answered: list[_Outcome] = []
    attempts, expired = 0, 0
    scan_at, contended = 0.0, False
    try:
        while True:
            claiming = time.monotonic() < deadline
            if claiming and publish is not None:
                publish()
            granted = _SENDERS.take(_process_concurrency()) if claiming else 0
            claimed: list[_Claim] = []
            # Scan every endpoint only every POLL_SECONDS (the scan is most of a round's
            # cost), else refill the slots answers freed; while endpoints wait for want of
            # slots, every round scans, so the longest waiting goes first.
            scan = contended or not answered or time.monotonic() >= scan_at
            refill = None if scan else dict(Counter(o.claim.endpoint.pk for o in answered))
            try:
                # Handed over first: a round failing after its record committed must not
                # have the `finally` record the same answers again.
                batch, answered = answered, []
                claimed, round_contended, expired = _round(answered=batch, now=now or timezone.now(), limit=granted, refill=refill)
                if scan:
                    scan_at, contended = time.monotonic() + POLL_SECONDS, round_contended
            finally:
                _SENDERS.give(granted - len(claimed))
            for claim in claimed:
                in_flight[_SENDERS.submit(claim, connections)] = claim
            if not in_flight and not expired:  # a round that only expired rows: more may be due
                return attempts
            # Wait for an answer; while claiming, look for new due work now and then too.
            done, pending = wait(list(in_flight), timeout=POLL_SECONDS if claiming else None, return_when=FIRST_COMPLETED)
            if done and pending:
                done |= wait(pending, timeout=GATHER_SECONDS)[0]
            answered = _collected(done, in_flight)
            attempts += len(answered)
    finally:
        # Also when cut short (a soft time limit): what is in flight is recorded, so none
        # of it is sent again. A process killed outright leaves its leases to run out.
        if in_flight:
            done, _ = wait(list(in_flight))
            answered += _collected(done, in_flight)
        if answered:
            _round(answered=answered)


def _collected(done: set[Future[_Outcome]], in_flight: dict[Future[_Outcome], _Claim]) -> list[_Outcome]:
    outcomes = [future.result() for future in done]
    for future in done:
        del in_flight[future]
    _SENDERS.give(len(outcomes))
    return outcomes


def _round(
    *, answered: Sequence[_Outcome], now: datetime | None = None, limit: int = 0, refill: Mapping[str, int] | None = None
) -> tuple[list[_Claim], bool, int]:
    """Record `answered` and claim up to `limit` deliveries at `now`, in one transaction,
    so a slot an answer frees is filled by the commit that frees it; a claim that fails
    still lets the record commit. Metrics and logs follow the commit.

    Locks: see `_outcomes_write`, then `_deliveries_claim`."""
    failed: BaseException | None = None
    claimed: list[_Claim] = []
    contended, expired = False, 0
    with transaction.atomic():
        counted = _outcomes_write(answered)
        if limit > 0 and now is not None:
            try:
                claimed, contended, expired = _deliveries_claim(now=now, limit=limit, refill=refill)
            except Exception as exc:  # noqa: BLE001  # re-raised once the record has committed
                failed = exc
    _outcomes_count(counted)
    if failed is not None:
        raise failed
    return claimed, contended, expired


_Counted = list[tuple["_Outcome", tuple[str, bool]]]


def _outcomes_write(outcomes: Sequence[_Outcome]) -> _Counted:
    """Write sent attempts in the caller's transaction (attempt rows, delivered rows, each
    failure's retry); return what `_outcomes_count` counts after the commit.

    Locks: the delivery rows it updates, then (a delivery that gave up) its endpoint's row,
    SKIP LOCKED (never waited for: see `_failure_record`)."""
    if not outcomes:
        return []
    webhook_attempts_insert(
        attempts=[
            WebhookDeliveryAttempt(
                delivery=o.claim.delivery, attempted_at=o.attempted_at, succeeded=o.succeeded, status_code=o.status_code,
                latency_ms=o.latency_ms, address=o.address, response_excerpt=o.excerpt, error=o.error,
            )
            for o in outcomes
        ]
    )
    delivered = [o for o in outcomes if o.succeeded]
    # One UPDATE per (attempted at, status code): a round's claims share their attempt's
    # instant, so a round is one or two statements, not a CASE over every row.
    same: dict[tuple[datetime, int | None], list[str]] = {}
    for o in delivered:
        same.setdefault((o.attempted_at, o.status_code), []).append(o.claim.delivery.pk)
    for (attempted_at, status_code), ids in same.items():
        webhook_deliveries_delivered(delivery_ids=ids, at=attempted_at, status_code=status_code)
    return [(o, ("succeeded", False)) for o in delivered] + [(o, _failure_record(o)) for o in outcomes if not o.succeeded]


def _outcomes_count(counted: _Counted) -> None:
    for outcome, (label, disabled) in counted:
        metrics.WEBHOOK_DELIVERIES.labels(outcome=label).inc()
        if disabled:
            metrics.WEBHOOK_ENDPOINTS_DISABLED.inc()
            logger.warning("webhook endpoint disabled", extra={"endpoint": outcome.claim.delivery.endpoint_id, "error": outcome.error})


def _failure_record(outcome: _Outcome) -> tuple[str, bool]:
    """Schedule the retry of a failed attempt, or give up on the delivery (and disable the
    endpoint if nothing got through to it for the window); return the metric label and
    whether the endpoint was disabled. Only the claim still holding the lease schedules: a
    delivery redelivered or claimed again keeps its new owner's schedule."""
    delivery, now, error = outcome.claim.delivery, outcome.attempted_at, outcome.shown_error
    fields = {"attempts": F("attempts") + 1, "last_attempt_at": now, "last_status_code": outcome.status_code, "last_error": error}
    held = WebhookDelivery.objects.filter(pk=delivery.pk, status=WebhookDeliveryStatus.PENDING, leased_until=outcome.claim.lease)
    following = now + retry_delay(attempts=delivery.attempts + 1)
    if following <= delivery.give_up_at:
        held.update(**fields, next_attempt_at=following, leased_until=None)
        return "retrying", False
    if not held.update(**fields, status=WebhookDeliveryStatus.FAILED, leased_until=None):
        return "retrying", False
    # One event the receiver cannot take fails that delivery, not the endpoint.
    if WebhookDelivery.objects.filter(
        endpoint_id=delivery.endpoint_id, status=WebhookDeliveryStatus.SUCCEEDED, delivered_at__gt=now - RETRY_WINDOW
    ).exists():
        return "gave_up", False
    # Nor one enabled again (or registered) within the window: a delivery that waited while it was
    # disabled can give up minutes after, with nothing delivered in a window the endpoint spent disabled.
    # The endpoint's row only if free now (SKIP LOCKED): this transaction holds delivery rows,
    # and a redelivery or re-enable holding the endpoint waits for a delivery row (endpoint,
    # then delivery): waiting here would close a cycle. Skipped, the next give-up disables it.
    settled = now - RETRY_WINDOW
    free = WebhookEndpoint.objects.filter(pk=delivery.endpoint_id).select_for_update(no_key=True, skip_locked=True).values("pk")
    disabled = WebhookEndpoint.objects.filter(
        Q(enabled_at__lte=settled) | Q(enabled_at__isnull=True, created__lte=settled),
        pk__in=free, status=WebhookEndpointStatus.ENABLED,
    ).update(
        status=WebhookEndpointStatus.DISABLED,
        disabled_reason=(
            f"Disabled {now:%Y-%m-%d %H:%M} UTC: every delivery failed for {RETRY_WINDOW.days} days; "
            f"the last, {delivery.id}: {error}"
        )[:500],
        updated=now,
    )
    return "gave_up", bool(disabled)


@transaction.atomic
def webhook_delivery_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """Send a delivery again: pending, due now, with a fresh retry window if needed (its endpoint
    must be enabled); one being sent right now goes again too. The relay is kicked after commit.
    Locks: the endpoint's row, then the delivery's (`webhook_endpoint_then_delivery_lock`)."""
    locked = webhook_endpoint_then_delivery_lock(delivery_id=delivery.pk)
    if locked.endpoint.status != WebhookEndpointStatus.ENABLED:
        raise WebhookDeliveryNotRedeliverable("the webhook endpoint is disabled; enable it first", param="delivery")
    now = timezone.now()
    locked.next_attempt_at, locked.leased_until = now, None
    fields = ["next_attempt_at", "leased_until"]
    if locked.status != WebhookDeliveryStatus.PENDING or locked.give_up_at <= now:
        locked.status, locked.give_up_at = WebhookDeliveryStatus.PENDING, now + RETRY_WINDOW
        fields += ["status", "give_up_at"]
    locked.save(update_fields=fields)
    outbox_relay_kick_on_commit()
    return locked

