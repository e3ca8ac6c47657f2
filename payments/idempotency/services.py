"""The one idempotency mechanism (SPEC 6). Call inside the tenant's schema.

Two engines share the records, the windows, the replay cache and the metrics:

- `idempotency_execute` (internal effects). One transaction, owned here (through
  `payments.db.run_atomic`, retried whole on conflicts): INSERT of the claim with ON
  CONFLICT DO NOTHING, the effect, the outbox row and the stored response. Under READ
  COMMITTED a concurrent duplicate's INSERT blocks on the unique index until the winner
  commits (then it conflicts and reads the finished record) or rolls back (then it
  claims); it can never see a half-done effect. The wait is bounded by setting
  `lock_timeout` (the tenant's wait budget) for that one INSERT.
- `idempotency_execute_external` (external effects, e.g. a PSP call). The claim (state
  in_flight, lease, fence) and the caller's outbox row commit first; the call happens
  outside any transaction; completion is a compare-and-set on the fence. An expired
  lease is taken over by bumping the fence; a late writer with the old fence fails and
  changes nothing (`StaleFence`).

Outcomes by status of the executed response: 2xx/3xx and 402 are stored and replayed;
other 4xx (validation before execution) are not stored (the claim is rolled back or
released); 5xx and unexpected exceptions leave `failed_retryable` so a retry executes
again. Replays are served from Redis when cached, else from PostgreSQL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Literal

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection, transaction

from payments.idempotency import metrics
from payments.idempotency.cache import CachedResponse, ReplayPrefetch, replay_cache_get, replay_cache_set
from payments.idempotency.canonical import fingerprint_of_value
from payments.idempotency.errors import (
    IdempotencyError,
    IdempotencyKeyExpired,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    StaleFence,
)
from payments.idempotency.locks import idempotency_record_fence_lock
from payments.idempotency.models import Effect, RecordState
from payments.idempotency.selectors import (
    IdempotencyPolicy,
    RecordSnapshot,
    idempotency_policy_get,
    idempotency_record_snapshot,
    idempotency_stuck_count,
)
from payments.idempotency.statements import CLAIM_SQL, COMPLETE_SQL
from wallets import ids
from wallets import metrics as wallet_metrics
from wallets.errors import TallyError, Unavailable
from wallets.transactions import is_connection_failure, run_atomic, sqlstate_of

POLL_INTERVAL_SECONDS = 0.02
MAX_ROUNDS = 20  # a round ends early only when the record changed under us; 20 is generous
LOCK_NOT_AVAILABLE = "55P03"

# --- Public value types ------------------------------------------------------------------


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class IdempotentCall:
    """Who asks for what: the scope (principal, key) and the request's fingerprint."""

    principal_id: str
    key: str
    fingerprint: str
    scope: str  # face name, or a task's own scope name
    request_id: str
    method: str = ""
    path: str = ""


@dataclass
class IdempotencyContext:
    """Given to the executor. `mint` returns ids that stay the same across re-executions
    of the same key (external retries, takeovers); `claimed_at` is the claim time."""

    principal_id: str
    key: str | None
    record_id: int | None
    fence: int
    claimed_at: datetime | None
    minted: dict[str, str] = field(default_factory=dict)
    takeover: bool = False
    # External effects: set by the executor when its final writes must commit together
    # with the stored response. The engine then completes by calling it inside the fenced
    # completion's transaction (after locking the record and checking the fence), and
    # stores the response it returns (`idempotency_complete_produced`).
    complete_with: Callable[[], Executed] | None = None

    def mint(self, name: str, prefix: str) -> str:
        existing = self.minted.get(name)
        if existing is None:
            existing = ids.new_id(prefix)
            self.minted[name] = existing
        return existing


@dataclass(frozen=True)
class Executed:
    """What an executor returns: the response to store and, for the caller, any object."""

    response: StoredResponse
    value: Any = None


@dataclass(frozen=True)
class Outcome:
    response: StoredResponse
    replayed: bool
    source: Literal["executed", "postgres", "redis"]
    original_request_id: str
    stored: bool
    value: Any = None  # the executor's value when executed now, else None
    replay_until: datetime | None = None  # end of the replay window, on replays from PostgreSQL


class Disposition(Enum):
    STORE = "store"
    DISCARD = "discard"
    FAIL = "fail"


def disposition_for_status(status: int) -> Disposition:
    if status >= 500:
        return Disposition.FAIL
    if status >= 400 and status != 402:
        return Disposition.DISCARD
    return Disposition.STORE


# --- Control flow inside a round (never escape this module) ------------------------------


class _Discard(Exception):
    def __init__(self, executed: Executed) -> None:
        self.executed = executed


class _Failed(Exception):
    def __init__(self, executed: Executed) -> None:
        self.executed = executed


class _Refused(Exception):
    """A business refusal (402): roll back everything the view wrote, then store the answer."""

    def __init__(self, executed: Executed, minted: dict[str, str]) -> None:
        self.executed = executed
        self.minted = minted


class _Again(Exception):
    """The record changed between our statements (purged, taken over): start a new round."""


class _Busy(Exception):
    """Another holder's in-flight claim is committed: poll until it resolves or we give up."""

    def __init__(self, snapshot: RecordSnapshot) -> None:
        self.snapshot = snapshot


class _WaitTimedOut(Exception):
    pass


# --- SQL ---------------------------------------------------------------------------------

_TAKEOVER_SQL = """
UPDATE idempotency_record SET
    state = 'in_flight', fence = fence + 1,
    lease_expires_at = clock_timestamp() + make_interval(secs => %s::double precision),
    fingerprint = %s, request_id = %s, scope = %s, effect = %s, method = %s, path = %s,
    response_status = NULL, response_headers = NULL, response_body = NULL, completed_at = NULL,
    created = CASE WHEN %s THEN clock_timestamp() ELSE created END,
    minted = CASE WHEN %s THEN '{}'::jsonb ELSE minted END,
    updated = clock_timestamp()
WHERE id = %s AND fence = %s AND state = %s
RETURNING fence, created, minted
"""


def _ms(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}ms"


def _lock_timeout_set(remaining_seconds: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [_ms(remaining_seconds)])


def _is_lock_timeout(exc: BaseException) -> bool:
    return sqlstate_of(exc) == LOCK_NOT_AVAILABLE


def _claim_insert(*, call: IdempotentCall, effect: str, lease_seconds: int, remaining_seconds: float) -> tuple[int, datetime] | None:
    """Claim (principal, key) in the current transaction. Needs: an open transaction.

    Blocks while another uncommitted transaction holds the same key, at most
    `remaining_seconds` (then `_WaitTimedOut`). The rest of the transaction keeps that
    lock_timeout: an effect stuck on a lock longer than a duplicate may wait for it gets
    55P03 (retried whole as a conflict) instead of holding the key hostage; and resetting
    it would cost a round trip on every keyed request."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                CLAIM_SQL,
                [
                    _ms(remaining_seconds), call.principal_id, call.key, call.scope, effect, call.fingerprint,
                    lease_seconds, call.request_id, call.method[:10], call.path[:512],
                ],
            )
            row = cursor.fetchone()
    except DatabaseError as exc:
        if _is_lock_timeout(exc):
            raise _WaitTimedOut() from exc
        raise
    return None if row is None else (int(row[0]), row[1])


def _takeover(
    *, call: IdempotentCall, effect: str, snapshot: RecordSnapshot, lease_seconds: int, renew: bool, remaining_seconds: float
) -> IdempotencyContext:
    """Fenced takeover of an existing record (fence + 1). Needs: an open transaction.

    `renew` makes it a brand-new claim (the old record was past both windows): new claim
    time, no minted ids. Raises `_Again` when someone else moved the fence first, or the
    record left the state the decision was made on (a late holder completed it under the
    same fence while this statement waited on its row lock: it must be replayed, not reopened)."""
    _lock_timeout_set(remaining_seconds)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                _TAKEOVER_SQL,
                [
                    lease_seconds, call.fingerprint, call.request_id, call.scope, effect, call.method[:10], call.path[:512],
                    renew, renew, snapshot.id, snapshot.fence, snapshot.state,
                ],
            )
            row = cursor.fetchone()
    except DatabaseError as exc:
        if _is_lock_timeout(exc):
            raise _WaitTimedOut() from exc
        raise
    if row is None:
        raise _Again()
    minted = row[2] if not isinstance(row[2], str) else json.loads(row[2])
    return IdempotencyContext(
        principal_id=call.principal_id, key=call.key, record_id=snapshot.id, fence=int(row[0]), claimed_at=row[1],
        minted={str(k): str(v) for k, v in dict(minted or {}).items()}, takeover=True,
    )


def _store_completed(*, ctx: IdempotencyContext, call: IdempotentCall, response: StoredResponse) -> datetime | None:
    """Fenced completion. Needs: the record's fence still equal to `ctx.fence`.

    Takes the record's row lock. Returns the claim time, or None if the fence moved."""
    with connection.cursor() as cursor:
        cursor.execute(
            COMPLETE_SQL,
            [
                response.status, json.dumps(response.headers, sort_keys=True), response.body, json.dumps(ctx.minted, sort_keys=True),
                call.request_id, ctx.record_id, ctx.fence,
            ],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def _executed_outcome(*, call: IdempotentCall, executed: Executed, stored: bool) -> Outcome:
    return Outcome(
        response=executed.response, replayed=False, source="executed", original_request_id=call.request_id, stored=stored, value=executed.value
    )


def _replay_outcome(*, snapshot: RecordSnapshot, policy: IdempotencyPolicy, call: IdempotentCall) -> Outcome:
    assert snapshot.response_status is not None and snapshot.response_body is not None
    response = StoredResponse(status=snapshot.response_status, headers=snapshot.response_headers, body=snapshot.response_body)
    return Outcome(
        response=response, replayed=True, source="postgres", original_request_id=snapshot.request_id, stored=True,
        replay_until=snapshot.replay_until(policy),
    )


def _cache_after_replay(*, call: IdempotentCall, outcome: Outcome, replay_until: datetime) -> None:
    replay_cache_set(
        principal_id=call.principal_id, key=call.key,
        entry=CachedResponse(
            fingerprint=call.fingerprint, status=outcome.response.status, headers=outcome.response.headers,
            body=outcome.response.body, request_id=outcome.original_request_id, replay_until=replay_until.timestamp(),
        ),
    )


def _cached_replay(call: IdempotentCall, prefetched: ReplayPrefetch | None = None) -> Outcome | None:
    if prefetched is not None and (prefetched.principal_id, prefetched.key) == (call.principal_id, call.key):
        cached = prefetched.entry  # looked up in the caller's Redis round trip
    else:
        cached = replay_cache_get(principal_id=call.principal_id, key=call.key)
    if cached is None:
        return None
    if cached.fingerprint != call.fingerprint:
        metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES.inc()
        raise IdempotencyKeyReused()
    metrics.IDEMPOTENCY_REPLAYS.labels(source="redis").inc()
    response = StoredResponse(status=cached.status, headers=cached.headers, body=cached.body)
    return Outcome(response=response, replayed=True, source="redis", original_request_id=cached.request_id, stored=True)


def _check_existing(*, call: IdempotentCall, snapshot: RecordSnapshot, policy: IdempotencyPolicy) -> str:
    """Decide what an existing record means for this call.

    Returns "replay", "renew" (past both windows: a new key), "retry" (failed_retryable:
    execute again) or "busy" (in flight); raises 410/422 answers."""
    phase = snapshot.phase(policy)
    if snapshot.state == RecordState.IN_FLIGHT:
        if snapshot.fingerprint != call.fingerprint:
            metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES.inc()
            raise IdempotencyKeyReused()
        return "busy"
    if phase == "expired":
        return "renew"
    if snapshot.fingerprint != call.fingerprint:
        metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES.inc()
        raise IdempotencyKeyReused()
    if snapshot.state == RecordState.COMPLETED:
        if phase == "tombstone":
            raise IdempotencyKeyExpired()
        return "replay"
    return "retry"


def _fail_closed(exc: BaseException) -> Unavailable:
    wallet_metrics.FAIL_CLOSED.labels(store="postgres").inc()
    error = Unavailable("idempotency store unavailable: retry later")
    error.__cause__ = exc
    return error


# --- Internal effects -------------------------------------------------------------------


def idempotency_execute(
    *,
    call: IdempotentCall,
    policy: IdempotencyPolicy,
    execute: Callable[[IdempotencyContext], Executed],
    prefetched: ReplayPrefetch | None = None,
) -> Outcome:
    """Run `execute` at most once per (principal, key): claim, effect and stored response
    in one transaction, which this function owns (retried whole on conflicts).

    `prefetched`: the replay-cache lookup, when the caller already made it (the API
    reads it in the throttles' Redis call); else this function makes it.

    Locks: inserts the claim row (unique index: a duplicate waits for us); `execute` runs
    inside the transaction and takes its own locks after it. `execute` may run more than
    once (conflict retries), always in a fresh transaction, so it must have no effect
    outside the database. It returns the response; it should raise only for database
    errors (propagated for retry) or bugs (the record is left failed_retryable).

    Answers: IdempotencyKeyReused (422), IdempotencyKeyExpired (410), IdempotencyKeyInUse
    (409, after waiting up to `policy.wait_ms`), Unavailable (503, database down).
    """
    cached = _cached_replay(call, prefetched)
    if cached is not None:
        return cached
    started = time.monotonic()
    deadline = started + policy.wait_ms / 1000.0
    waited = False
    nested = connection.in_atomic_block

    def round_() -> Outcome:
        nonlocal waited
        claimed = _claim_insert(call=call, effect=Effect.INTERNAL, lease_seconds=policy.lease_seconds, remaining_seconds=deadline - time.monotonic())
        if claimed is not None:
            ctx = IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=claimed[0], fence=1, claimed_at=claimed[1])
            return _execute_in_transaction(call=call, ctx=ctx, execute=execute)
        waited = True
        snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
        if snapshot is None:
            raise _Again()
        verdict = _check_existing(call=call, snapshot=snapshot, policy=policy)
        if verdict == "replay":
            if snapshot.completed_at is not None and snapshot.completed_at >= snapshot.transaction_started:
                metrics.IDEMPOTENCY_CLAIM_CONFLICTS.inc()  # it finished while we waited: we lost a race
            return _replay_outcome(snapshot=snapshot, policy=policy, call=call)
        if verdict == "busy":
            raise _Busy(snapshot)
        ctx = _takeover(
            call=call, effect=Effect.INTERNAL, snapshot=snapshot, lease_seconds=policy.lease_seconds,
            renew=True, remaining_seconds=deadline - time.monotonic(),
        )
        return _execute_in_transaction(call=call, ctx=ctx, execute=execute)

    def atomic_round() -> Outcome:
        if nested:  # inside a caller's transaction: a savepoint is all we can roll back
            with transaction.atomic():
                return round_()
        return round_()

    try:
        for _ in range(MAX_ROUNDS):
            try:
                outcome = run_atomic(atomic_round, operation=f"idempotency.{call.scope}")
            except _Again:
                continue
            except _Busy as busy:
                if time.monotonic() >= deadline:
                    raise _WaitTimedOut() from None
                del busy
                time.sleep(min(POLL_INTERVAL_SECONDS, max(0.0, deadline - time.monotonic())))
                continue
            except _Discard as discard:
                return _executed_outcome(call=call, executed=discard.executed, stored=False)
            except _Refused as refused:
                try:
                    stored = _store_refusal(call=call, policy=policy, refused=refused, deadline=deadline)
                except _Again:
                    continue
                if stored is None:
                    continue
                return stored
            except _Failed as failed:
                _record_failed(call=call, effect=Effect.INTERNAL)
                return _executed_outcome(call=call, executed=failed.executed, stored=False)
            if outcome.replayed:
                metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
                if outcome.replay_until is not None:
                    _cache_after_replay(call=call, outcome=outcome, replay_until=outcome.replay_until)
            return outcome
        raise _WaitTimedOut()
    except _WaitTimedOut:
        return _in_use_or_replay(call=call, policy=policy, started=started)
    except (IdempotencyError, Unavailable):
        raise
    except DatabaseError as exc:
        if is_connection_failure(exc):
            raise _fail_closed(exc) from exc
        _record_failed(call=call, effect=Effect.INTERNAL)
        raise
    except Exception:
        _record_failed(call=call, effect=Effect.INTERNAL)
        raise
    finally:
        if waited:
            metrics.IDEMPOTENCY_INFLIGHT_WAIT_SECONDS.observe(time.monotonic() - started)


def _execute_in_transaction(*, call: IdempotentCall, ctx: IdempotencyContext, execute: Callable[[IdempotencyContext], Executed]) -> Outcome:
    executed = execute(ctx)
    disposition = disposition_for_status(executed.response.status)
    if disposition is Disposition.DISCARD:
        raise _Discard(executed)
    if disposition is Disposition.FAIL:
        raise _Failed(executed)
    if executed.response.status >= 400:
        raise _Refused(executed, dict(ctx.minted))
    if _store_completed(ctx=ctx, call=call, response=executed.response) is None:
        raise StaleFence(f"record {ctx.record_id} fence {ctx.fence} moved inside its own transaction")
    return _executed_outcome(call=call, executed=executed, stored=True)


def _store_refusal(*, call: IdempotentCall, policy: IdempotencyPolicy, refused: _Refused, deadline: float) -> Outcome | None:
    """Second, short transaction after a refusal rolled back the view's writes: claim
    again and store the refusal without executing anything. None if someone else holds
    or finished the key meanwhile (the caller's next round replays or waits for it).
    Locks: the claim row (insert or fenced takeover)."""

    def write() -> Outcome | None:
        claimed = _claim_insert(call=call, effect=Effect.INTERNAL, lease_seconds=policy.lease_seconds, remaining_seconds=deadline - time.monotonic())
        if claimed is not None:
            ctx = IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=claimed[0], fence=1, claimed_at=claimed[1])
        else:
            snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
            if snapshot is None:
                raise _Again()
            if _check_existing(call=call, snapshot=snapshot, policy=policy) in ("replay", "busy"):
                return None
            ctx = _takeover(
                call=call, effect=Effect.INTERNAL, snapshot=snapshot, lease_seconds=policy.lease_seconds,
                renew=True, remaining_seconds=deadline - time.monotonic(),
            )
        ctx.minted = dict(refused.minted)
        if _store_completed(ctx=ctx, call=call, response=refused.executed.response) is None:
            raise StaleFence(f"record {ctx.record_id} fence {ctx.fence} moved inside its own transaction")
        return _executed_outcome(call=call, executed=refused.executed, stored=True)

    return run_atomic(write, operation=f"idempotency.{call.scope}.refusal")


def _in_use_or_replay(*, call: IdempotentCall, policy: IdempotencyPolicy, started: float) -> Outcome:
    """After the wait budget: one last look (it may have just finished), else 409."""
    try:
        snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    except DatabaseError as exc:
        if is_connection_failure(exc):
            raise _fail_closed(exc) from exc
        raise
    if snapshot is not None and _check_existing(call=call, snapshot=snapshot, policy=policy) == "replay":
        metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
        return _replay_outcome(snapshot=snapshot, policy=policy, call=call)
    metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc()
    retry_after = 1
    if snapshot is not None and snapshot.state == RecordState.IN_FLIGHT and snapshot.lease_expires_at is not None:
        retry_after = max(1, int((snapshot.lease_expires_at - snapshot.now).total_seconds() + 0.999))
    raise IdempotencyKeyInUse(retry_after=min(retry_after, 60))


_FAILED_SQL = """
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', '1000ms', true) AS lock_timeout)
INSERT INTO idempotency_record
    (principal_id, "key", scope, effect, fingerprint, state, fence, lease_expires_at,
     request_id, method, path, minted, created, updated)
SELECT %s, %s, %s, %s, %s, 'failed_retryable', 1, NULL, %s, %s, %s, '{}'::jsonb, clock_timestamp(), clock_timestamp()
FROM cfg
ON CONFLICT (principal_id, "key") DO NOTHING
"""


def _record_failed(*, call: IdempotentCall, effect: str) -> None:
    """Best effort, after the failed transaction rolled back: leave a failed_retryable
    record so the key stays bound to its fingerprint and operators see the failure. An
    existing record (someone else's claim, or the one we took over) is left as it is."""

    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                _FAILED_SQL,
                [call.principal_id, call.key, call.scope, effect, call.fingerprint, call.request_id, call.method[:10], call.path[:512]],
            )

    def in_a_transaction() -> None:
        if connection.in_atomic_block:
            with transaction.atomic():
                write()
        else:
            run_atomic(write, operation="idempotency.record_failed")

    _best_effort(in_a_transaction)


# --- External effects -------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A committed in-flight claim: the holder must finish with the same fence."""

    context: IdempotencyContext
    lease_seconds: int


@dataclass(frozen=True)
class Busy:
    retry_after: int


def idempotency_claim(
    *,
    call: IdempotentCall,
    policy: IdempotencyPolicy,
    mint: dict[str, str] | None = None,
    on_claim: Callable[[IdempotencyContext], None] | None = None,
) -> Claim | Outcome | Busy:
    """Claim (principal, key) for an external effect and COMMIT the claim.

    In one transaction: the in-flight record (lease `policy.lease_seconds`, fence 1, or
    fence + 1 when taking over a failed or lease-expired claim), the ids in `mint`
    ({"topup": "top"}) minted once, and `on_claim(ctx)` (write the pending object and its
    outbox row there). Returns the Claim, a replay Outcome, or Busy (someone holds a live
    lease). Raises 410/422 answers. Locks: the record row (insert or fenced update).
    """

    def round_() -> Claim | Outcome | Busy:
        claimed = _claim_insert(call=call, effect=Effect.EXTERNAL, lease_seconds=policy.lease_seconds, remaining_seconds=policy.wait_ms / 1000.0)
        if claimed is not None:
            ctx = IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=claimed[0], fence=1, claimed_at=claimed[1])
        else:
            snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
            if snapshot is None:
                raise _Again()
            verdict = _check_existing(call=call, snapshot=snapshot, policy=policy)
            if verdict == "replay":
                return _replay_outcome(snapshot=snapshot, policy=policy, call=call)
            if verdict == "busy" and not snapshot.lease_expired:
                remaining = (snapshot.lease_expires_at - snapshot.now).total_seconds() if snapshot.lease_expires_at else 1.0
                return Busy(retry_after=max(1, int(remaining + 0.999)))
            ctx = _takeover(
                call=call, effect=Effect.EXTERNAL, snapshot=snapshot, lease_seconds=policy.lease_seconds,
                renew=verdict == "renew", remaining_seconds=policy.wait_ms / 1000.0,
            )
            if verdict == "busy":
                metrics.IDEMPOTENCY_LEASE_TAKEOVERS.inc()
        for name, prefix in (mint or {}).items():
            ctx.mint(name, prefix)
        if on_claim is not None:
            on_claim(ctx)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE idempotency_record SET minted = %s::jsonb WHERE id = %s AND fence = %s",
                [json.dumps(ctx.minted, sort_keys=True), ctx.record_id, ctx.fence],
            )
        return Claim(context=ctx, lease_seconds=policy.lease_seconds)

    try:
        for _ in range(MAX_ROUNDS):
            try:
                result = run_atomic(round_, operation=f"idempotency.claim.{call.scope}")
            except _Again:
                continue
            if isinstance(result, Outcome):
                metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
            return result
        return Busy(retry_after=1)
    except _WaitTimedOut:
        return Busy(retry_after=1)
    except DatabaseError as exc:
        if is_connection_failure(exc):
            raise _fail_closed(exc) from exc
        raise


def idempotency_complete(
    *,
    record_id: int,
    fence: int,
    call: IdempotentCall,
    response: StoredResponse,
    effect: Callable[[], None] | None = None,
    ctx: IdempotencyContext | None = None,
) -> bool:
    """Fenced completion: store `response` only if our fence is still current.

    In one transaction: the compare-and-set on (id, fence, in_flight), which takes the
    record's row lock, then `effect()` (the holder's own final writes). If the fence
    moved (our lease was taken over) nothing is written, `effect` does not run, and the
    result is False: a stale writer changes nothing."""
    context = ctx or IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=record_id, fence=fence, claimed_at=None)
    if ctx is None:
        existing = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
        if existing is not None and existing.id == record_id:
            context.minted = dict(existing.minted)

    def write() -> None:
        if _store_completed(ctx=context, call=call, response=response) is None:
            raise StaleFence(f"record {record_id}: fence {fence} is no longer current")
        if effect is not None:
            effect()

    try:
        run_atomic(write, operation="idempotency.complete")
    except StaleFence:
        return False
    return True


def idempotency_complete_produced(*, ctx: IdempotencyContext, call: IdempotentCall, produce: Callable[[], Executed]) -> Executed | None:
    """Fenced completion whose final writes and response come from `produce`, all in ONE
    transaction: lock the record and check our fence (and that it is still in flight), run
    `produce()` (the holder's final writes; it returns the response to store: 2xx or 402),
    then the compare-and-set that stores it. Returns what `produce` returned, or None if the
    fence moved (our lease was taken over): then nothing `produce` wrote is kept.

    `produce` may run more than once (conflict retries, each in a fresh transaction), so
    it must only touch the database. Locks: the record row, then whatever `produce` takes."""
    record_id = ctx.record_id
    assert record_id is not None

    def write() -> Executed:
        # Lock the record: ours only while in flight under our fence.
        if not idempotency_record_fence_lock(record_id=record_id, fence=ctx.fence, in_flight=True):
            raise StaleFence(f"record {ctx.record_id}: fence {ctx.fence} is no longer current")
        executed = produce()
        if disposition_for_status(executed.response.status) is not Disposition.STORE:
            raise ValueError(f"a produced completion must be stored (2xx or 402), not {executed.response.status}")
        if _store_completed(ctx=ctx, call=call, response=executed.response) is None:
            raise StaleFence(f"record {ctx.record_id}: fence {ctx.fence} is no longer current")
        return executed

    try:
        return run_atomic(write, operation="idempotency.complete")
    except StaleFence:
        return None


def _fenced_update(sql: str, params: list[Any], operation: str, effect: Callable[[], None] | None = None) -> bool:
    def write() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            done = bool(cursor.rowcount == 1)
        if done and effect is not None:
            effect()
        return done

    return bool(run_atomic(write, operation=operation))


def idempotency_fail(*, record_id: int, fence: int) -> bool:
    """in_flight -> failed_retryable if `fence` is current (the next retry executes again)."""
    return _fenced_update(
        "UPDATE idempotency_record SET state = 'failed_retryable', lease_expires_at = NULL, updated = clock_timestamp() "
        "WHERE id = %s AND fence = %s AND state = 'in_flight'",
        [record_id, fence], "idempotency.fail",
    )


def idempotency_release(*, record_id: int, fence: int, effect: Callable[[], None] | None = None) -> bool:
    """Drop an in-flight claim whose request failed validation (nothing stored). `effect`
    (the holder's undo of what its `on_claim` wrote) runs in the same transaction, only if
    the fence was still ours."""
    return _fenced_update(
        "DELETE FROM idempotency_record WHERE id = %s AND fence = %s AND state = 'in_flight'", [record_id, fence], "idempotency.release",
        effect,
    )


def idempotency_lease_extend(*, record_id: int, fence: int, lease_seconds: int) -> bool:
    """Heartbeat of a long external call: push the lease out if we still hold the fence."""
    return _fenced_update(
        "UPDATE idempotency_record SET lease_expires_at = clock_timestamp() + make_interval(secs => %s::double precision), "
        "updated = clock_timestamp() WHERE id = %s AND fence = %s AND state = 'in_flight'",
        [lease_seconds, record_id, fence], "idempotency.lease_extend",
    )


def idempotency_lease_takeover(
    *, principal_id: str, key: str, lease_seconds: int, include_failed: bool = False
) -> IdempotencyContext | None:
    """Take over an in-flight record whose lease expired (recovery worker): fence + 1 and a
    new lease, committed. With `include_failed`, a failed_retryable record is taken too
    (back in flight): a recovery that must finish what a failed attempt left unknown.
    Returns the new context, or None if the lease is live or the record gone or finished.
    The previous holder's fence is dead from the commit on. Locks: the record row."""

    def write() -> IdempotencyContext | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE idempotency_record SET fence = fence + 1, state = 'in_flight', "
                "lease_expires_at = clock_timestamp() + make_interval(secs => %s::double precision), updated = clock_timestamp() "
                'WHERE principal_id = %s AND "key" = %s AND ((state = \'in_flight\' AND lease_expires_at <= clock_timestamp()) '
                "OR (%s AND state = 'failed_retryable')) "
                "RETURNING id, fence, created, minted",
                [lease_seconds, principal_id, key, include_failed],
            )
            row = cursor.fetchone()
        if row is None:
            return None
        minted = row[3] if not isinstance(row[3], str) else json.loads(row[3])
        return IdempotencyContext(
            principal_id=principal_id, key=key, record_id=int(row[0]), fence=int(row[1]), claimed_at=row[2],
            minted={str(k): str(v) for k, v in dict(minted or {}).items()}, takeover=True,
        )

    ctx = run_atomic(write, operation="idempotency.takeover")
    if ctx is not None:
        metrics.IDEMPOTENCY_LEASE_TAKEOVERS.inc()
    return ctx


def idempotency_fence_assert(*, record_id: int, fence: int) -> None:
    """Lock the record and check we still hold `fence`. Needs: an open transaction (the
    holder's own). Raises StaleFence, so the holder's writes in that transaction roll back."""
    if not idempotency_record_fence_lock(record_id=record_id, fence=fence):
        raise StaleFence(f"record {record_id}: fence {fence} is no longer current")


def idempotency_execute_external(
    *,
    call: IdempotentCall,
    policy: IdempotencyPolicy,
    execute: Callable[[IdempotencyContext], Executed],
    mint: dict[str, str] | None = None,
    on_claim: Callable[[IdempotencyContext], None] | None = None,
    on_release: Callable[[IdempotencyContext], None] | None = None,
) -> Outcome:
    """Claim (committed, with `on_claim`'s outbox row), run `execute` outside any
    transaction (pass `ctx.key`/minted ids to the provider as its idempotency key), then
    complete with a fenced compare-and-set. If our lease was taken over meanwhile, our
    completion changes nothing and we answer what the record holds (or 409).

    `on_claim` runs again on every takeover of the key (same minted ids): it must be
    idempotent (get-or-create its pending object). If it raises, the claim's transaction
    rolls back and the exception propagates: nothing is stored. If `execute` sets
    `ctx.complete_with`, the final writes and the stored response come from it, inside the
    fenced completion (`idempotency_complete_produced`). A discarded answer (4xx other than
    402) releases the claim and runs `on_release(ctx)` in that transaction, to undo what
    `on_claim` wrote."""
    cached = _cached_replay(call)
    if cached is not None:
        return cached
    started = time.monotonic()
    deadline = started + policy.wait_ms / 1000.0
    waited = False
    try:
        while True:
            claimed = idempotency_claim(call=call, policy=policy, mint=mint, on_claim=on_claim)
            if isinstance(claimed, Claim):
                break
            if isinstance(claimed, Outcome):
                return claimed
            waited = True
            if time.monotonic() >= deadline:
                metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc()
                raise IdempotencyKeyInUse(retry_after=min(claimed.retry_after, 60))
            time.sleep(min(POLL_INTERVAL_SECONDS * 2.5, max(0.0, deadline - time.monotonic())))
    finally:
        if waited:
            metrics.IDEMPOTENCY_INFLIGHT_WAIT_SECONDS.observe(time.monotonic() - started)

    ctx = claimed.context
    assert ctx.record_id is not None
    try:
        executed = execute(ctx)
    except Exception:
        _best_effort(lambda: idempotency_fail(record_id=ctx.record_id or 0, fence=ctx.fence))
        raise
    if ctx.complete_with is not None:
        produce = ctx.complete_with
        try:
            produced = idempotency_complete_produced(ctx=ctx, call=call, produce=produce)
        except Exception:
            _best_effort(lambda: idempotency_fail(record_id=ctx.record_id or 0, fence=ctx.fence))
            raise
        if produced is not None:
            return _executed_outcome(call=call, executed=produced, stored=True)
        return _superseded_answer(call=call, policy=policy)
    disposition = disposition_for_status(executed.response.status)
    if disposition is Disposition.DISCARD:
        undo = None if on_release is None else (lambda: on_release(ctx))
        _best_effort(lambda: idempotency_release(record_id=ctx.record_id or 0, fence=ctx.fence, effect=undo))
        return _executed_outcome(call=call, executed=executed, stored=False)
    if disposition is Disposition.FAIL:
        _best_effort(lambda: idempotency_fail(record_id=ctx.record_id or 0, fence=ctx.fence))
        return _executed_outcome(call=call, executed=executed, stored=False)
    if idempotency_complete(record_id=ctx.record_id, fence=ctx.fence, call=call, response=executed.response, ctx=ctx):
        return _executed_outcome(call=call, executed=executed, stored=True)
    return _superseded_answer(call=call, policy=policy)


def _superseded_answer(*, call: IdempotentCall, policy: IdempotencyPolicy) -> Outcome:
    """Our lease was taken over: the new holder's result is the answer (or 409 meanwhile)."""
    snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    if snapshot is not None and snapshot.state == RecordState.COMPLETED and snapshot.fingerprint == call.fingerprint:
        metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
        return _replay_outcome(snapshot=snapshot, policy=policy, call=call)
    metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc()
    raise IdempotencyKeyInUse()


def _best_effort(fn: Callable[[], object]) -> None:
    try:
        fn()
    except (DatabaseError, TallyError):
        return


# --- Plain API for tasks and management commands -----------------------------------------


@dataclass(frozen=True)
class RunResult:
    value: Any
    replayed: bool
    original_request_id: str


def idempotency_run(
    *,
    scope: str,
    principal_id: str,
    key: str,
    fn: Callable[[IdempotencyContext], Any],
    payload: Any = None,
    fingerprint: str | None = None,
    effect: Literal["internal", "external"] = "internal",
    policy: IdempotencyPolicy | None = None,
    request_id: str | None = None,
) -> RunResult:
    """Run `fn(ctx)` at most once for (principal_id, key) in the current tenant, for Celery
    tasks and management commands with their own keys (principal_id e.g. "task:relay").

    The fingerprint is `fingerprint`, else computed from (scope, principal_id, payload).
    `fn` returns a JSON-serialisable value (Decimal and datetime become strings); it is
    stored, and every call (first or replay) returns the same decoded JSON value.
    Internal: `fn` runs in the claim's transaction (locks: the claim row, then whatever
    `fn` takes). External: the claim commits first and `fn` runs outside a transaction.
    If `fn` raises, nothing is stored, the record is left failed_retryable and the
    exception propagates. Raises IdempotencyKeyReused / Expired / InUse, Unavailable.
    """
    resolved_policy = policy or idempotency_policy_get()
    call = IdempotentCall(
        principal_id=principal_id, key=key, scope=scope[:64],
        fingerprint=fingerprint or fingerprint_of_value(scope=scope, principal_id=principal_id, payload=payload),
        request_id=request_id or ids.new_id("req"), method="TASK", path=scope[:512],
    )

    def execute(ctx: IdempotencyContext) -> Executed:
        value = fn(ctx)
        body = json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return Executed(response=StoredResponse(status=200, headers={"Content-Type": "application/json"}, body=body))

    if effect == "external":
        outcome = idempotency_execute_external(call=call, policy=resolved_policy, execute=execute)
    else:
        outcome = idempotency_execute(call=call, policy=resolved_policy, execute=execute)
    return RunResult(value=json.loads(outcome.response.body), replayed=outcome.replayed, original_request_id=outcome.original_request_id)


# --- Retention ----------------------------------------------------------------------------

PURGE_BATCH = 1000


def idempotency_records_purge(*, policy: IdempotencyPolicy, batch_size: int = PURGE_BATCH, max_batches: int = 1000) -> int:
    """Delete records past their replay and tombstone windows, in batches (each its own
    short transaction, `FOR UPDATE SKIP LOCKED`, so live traffic is never blocked). In
    flight records are kept: the orphan recovery owns them. Returns how many went."""
    horizon = policy.replay_window_seconds + policy.tombstone_window_seconds
    total = 0

    def batch() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM idempotency_record WHERE id IN ("
                " SELECT id FROM idempotency_record WHERE created < clock_timestamp() - make_interval(secs => %s::double precision)"
                " AND state <> 'in_flight' ORDER BY created LIMIT %s FOR UPDATE SKIP LOCKED)",
                [horizon, batch_size],
            )
            return int(cursor.rowcount)

    for _ in range(max_batches):
        deleted = run_atomic(batch, operation="idempotency.purge")
        total += deleted
        if deleted < batch_size:
            break
    return total


def idempotency_maintenance_run(*, batch_size: int = PURGE_BATCH) -> int:
    """One tenant's housekeeping (its schema must be active): purge records past both
    windows, then publish how many in-flight records are past their lease. Returns the
    number purged. Locks: rows of each purge batch (SKIP LOCKED)."""
    purged = idempotency_records_purge(policy=idempotency_policy_get(), batch_size=batch_size)
    schema_name = str(getattr(connection, "schema_name", "public"))
    metrics.IDEMPOTENCY_STUCK_INFLIGHT.labels(tenant=schema_name).set(idempotency_stuck_count())
    return purged
