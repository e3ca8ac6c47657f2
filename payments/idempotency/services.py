"""The one idempotency mechanism (SPEC 6; docs/ARCHITECTURE.md). Call inside the tenant's
schema. `idempotency_execute`: claim, effect and stored response in one transaction; a
duplicate's INSERT waits on the winner's uncommitted row, bounded by `lock_timeout`.
`idempotency_execute_external`: the claim (lease, fence) commits first, the call runs
outside any transaction, and completion is a compare-and-set on the fence (`StaleFence`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

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
from payments.idempotency.models import Effect, IdempotencyRecord, RecordState
from payments.idempotency.selectors import (
    IdempotencyPolicy,
    RecordSnapshot,
    idempotency_policy_get,
    idempotency_record_snapshot,
    idempotency_stuck_count,
    str_dict_of,
)
from payments.idempotency.statements import (
    CLAIM_SQL,
    COMPLETE_SQL,
    FAILED_INSERT_SQL,
    LEASE_TAKEOVER_SQL,
    PURGE_SQL,
    RELEASE_SQL,
    TAKEOVER_SQL,
)
from wallets import ids
from wallets import metrics as wallet_metrics
from wallets.errors import TallyError, Unavailable
from wallets.transactions import is_connection_failure, run_atomic, sqlstate_of

POLL_INTERVAL_SECONDS = 0.02
MAX_ROUNDS = 20  # a round ends early only when the record changed under us; 20 is generous
LOCK_NOT_AVAILABLE = "55P03"
T = TypeVar("T")


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
    of the same key (external retries, takeovers)."""

    principal_id: str
    key: str | None
    record_id: int | None
    fence: int
    minted: dict[str, str] = field(default_factory=dict)
    takeover: bool = False
    # External effects: the executor's final writes, run in the fenced completion that
    # stores the response it returns (`idempotency_complete_produced`).
    complete_with: Callable[[], Executed] | None = None

    def mint(self, name: str, prefix: str) -> str:
        if name not in self.minted:
            self.minted[name] = ids.new_id(prefix)
        return self.minted[name]


@dataclass(frozen=True)
class Executed:
    """What an executor returns: the response to store and, for the caller, any object."""

    response: StoredResponse
    value: Any = None


@dataclass(frozen=True)
class Outcome:
    response: StoredResponse
    replayed: bool
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


class _RolledBack(Exception):
    """The answer is not stored with the view's writes: roll them back, then act on the
    disposition (a STORE here is a 402 refusal, stored alone in a second transaction)."""

    def __init__(self, executed: Executed, disposition: Disposition, minted: dict[str, str]) -> None:
        self.executed = executed
        self.disposition = disposition
        self.minted = minted


class _Again(Exception):
    """The record changed between our statements (purged, taken over): start a new round."""


class _Busy(Exception):
    """Another holder's in-flight claim is committed: poll until it resolves or we give up."""


class _WaitTimedOut(Exception):
    pass


def _ms(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}ms"


def _fetchone_waiting(sql: str, params: list[Any]) -> Any:
    """The first row of `sql`, or None; a row lock waited on past lock_timeout raises `_WaitTimedOut`."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    except DatabaseError as exc:
        if sqlstate_of(exc) == LOCK_NOT_AVAILABLE:
            raise _WaitTimedOut() from exc
        raise


def _claim(*, call: IdempotentCall, effect: str, policy: IdempotencyPolicy, remaining_seconds: float) -> IdempotencyContext | RecordSnapshot:
    """Claim (principal, key) with fence 1 in the open transaction, else read the record that
    holds it (`_Again` if gone). Waits on an uncommitted claim at most `remaining_seconds`;
    the transaction keeps that lock_timeout, so an effect stuck on a lock longer than a
    duplicate may wait gets 55P03 (retried whole), and no round trip resets it."""
    row = _fetchone_waiting(
        CLAIM_SQL,
        [
            _ms(remaining_seconds), call.principal_id, call.key, call.scope, effect, call.fingerprint,
            policy.lease_seconds, call.request_id, call.method[:10], call.path[:512],
        ],
    )
    if row is not None:
        return IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=int(row[0]), fence=1)
    snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    if snapshot is None:
        raise _Again()
    return snapshot


def _taken_over(*, principal_id: str, key: str, record_id: int, row: Any) -> IdempotencyContext:
    """The context of a takeover from its RETURNING fence, minted."""
    return IdempotencyContext(principal_id=principal_id, key=key, record_id=record_id, fence=int(row[0]), minted=str_dict_of(row[1]), takeover=True)


def _takeover(
    *, call: IdempotentCall, effect: str, snapshot: RecordSnapshot, policy: IdempotencyPolicy, renew: bool, remaining_seconds: float
) -> IdempotencyContext:
    """Fenced takeover (fence + 1) in the open transaction; `renew`: a brand-new claim (past
    both windows). `_Again` when the fence or the state moved since `snapshot` (a late
    holder that completed it meanwhile must be replayed, not reopened)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [_ms(remaining_seconds)])
    row = _fetchone_waiting(
        TAKEOVER_SQL,
        [
            policy.lease_seconds, call.fingerprint, call.request_id, call.scope, effect, call.method[:10], call.path[:512],
            renew, renew, snapshot.id, snapshot.fence, snapshot.state,
        ],
    )
    if row is None:
        raise _Again()
    return _taken_over(principal_id=call.principal_id, key=call.key, record_id=snapshot.id, row=row)


def _stale(record_id: int | None, fence: int) -> StaleFence:
    return StaleFence(f"record {record_id}: fence {fence} is no longer current")


def _store_completed(*, ctx: IdempotencyContext, call: IdempotentCall, response: StoredResponse) -> None:
    """Fenced completion; takes the record's row lock. Raises StaleFence if the fence moved."""
    with connection.cursor() as cursor:
        cursor.execute(
            COMPLETE_SQL,
            [
                response.status, json.dumps(response.headers, sort_keys=True), response.body, json.dumps(ctx.minted, sort_keys=True),
                call.request_id, ctx.record_id, ctx.fence,
            ],
        )
        if cursor.fetchone() is None:
            raise _stale(ctx.record_id, ctx.fence)


def _executed_outcome(*, call: IdempotentCall, executed: Executed, stored: bool) -> Outcome:
    return Outcome(response=executed.response, replayed=False, original_request_id=call.request_id, stored=stored, value=executed.value)


def _replay_outcome(*, snapshot: RecordSnapshot, policy: IdempotencyPolicy) -> Outcome:
    assert snapshot.response_status is not None and snapshot.response_body is not None
    response = StoredResponse(status=snapshot.response_status, headers=snapshot.response_headers, body=snapshot.response_body)
    return Outcome(
        response=response, replayed=True, original_request_id=snapshot.request_id, stored=True,
        replay_until=snapshot.created + timedelta(seconds=policy.replay_window_seconds),
    )


def _cached_replay(call: IdempotentCall, prefetched: ReplayPrefetch | None = None) -> Outcome | None:
    if prefetched is not None and (prefetched.principal_id, prefetched.key) == (call.principal_id, call.key):
        cached = prefetched.entry  # looked up in the caller's Redis round trip
    else:
        cached = replay_cache_get(principal_id=call.principal_id, key=call.key)
    if cached is None:
        return None
    if cached.fingerprint != call.fingerprint:
        raise _reused()
    metrics.IDEMPOTENCY_REPLAYS.labels(source="redis").inc()
    response = StoredResponse(status=cached.status, headers=cached.headers, body=cached.body)
    return Outcome(response=response, replayed=True, original_request_id=cached.request_id, stored=True)


def _reused() -> IdempotencyKeyReused:
    metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES.inc()
    return IdempotencyKeyReused()


def _check_existing(*, call: IdempotentCall, snapshot: RecordSnapshot, policy: IdempotencyPolicy) -> str:
    """What an existing record means for this call: "replay", "renew" (past both windows),
    "retry" (failed_retryable) or "busy" (in flight); raises the 410 and 422 answers."""
    phase = snapshot.phase(policy)
    if snapshot.state != RecordState.IN_FLIGHT and phase == "expired":
        return "renew"
    if snapshot.fingerprint != call.fingerprint:
        raise _reused()
    if snapshot.state == RecordState.IN_FLIGHT:
        return "busy"
    if snapshot.state == RecordState.COMPLETED:
        if phase == "tombstone":
            raise IdempotencyKeyExpired()
        return "replay"
    return "retry"


def _retry_after(snapshot: RecordSnapshot | None) -> int:
    """Seconds until an in-flight holder's lease runs out; 1 when there is no such lease."""
    if snapshot is None or snapshot.state != RecordState.IN_FLIGHT or snapshot.lease_expires_at is None:
        return 1
    return max(1, int((snapshot.lease_expires_at - snapshot.now).total_seconds() + 0.999))


def _fail_closed() -> Unavailable:
    wallet_metrics.FAIL_CLOSED.labels(store="postgres").inc()
    return Unavailable("idempotency store unavailable: retry later")


def _in_a_transaction(fn: Callable[[], T], *, operation: str) -> T:
    """`fn` in a transaction of its own (retried whole on conflicts), or in a savepoint of the
    caller's: inside the caller's transaction a savepoint is all we can roll back."""
    if connection.in_atomic_block:
        with transaction.atomic():
            return fn()
    return run_atomic(fn, operation=operation)


def _best_effort(fn: Callable[[], object]) -> None:
    try:
        fn()
    except (DatabaseError, TallyError):
        return


# --- Internal effects -------------------------------------------------------------------


def idempotency_execute(
    *,
    call: IdempotentCall,
    policy: IdempotencyPolicy,
    execute: Callable[[IdempotencyContext], Executed],
    prefetched: ReplayPrefetch | None = None,
) -> Outcome:
    """Run `execute` at most once per (principal, key): claim, effect and stored response
    in one transaction, owned here and retried whole on conflicts, so `execute` must have no
    effect outside the database. `prefetched`: the replay-cache lookup the throttles made.
    Locks: the claim row (a duplicate waits on it), then whatever `execute` takes.
    Raises IdempotencyKeyReused (422), IdempotencyKeyExpired (410), IdempotencyKeyInUse
    (409, after waiting up to `policy.wait_ms`), Unavailable (503)."""
    cached = _cached_replay(call, prefetched)
    if cached is not None:
        return cached
    started = time.monotonic()
    deadline = started + policy.wait_ms / 1000.0
    waited = False

    def round_() -> Outcome:
        nonlocal waited
        claimed = _claim(call=call, effect=Effect.INTERNAL, policy=policy, remaining_seconds=deadline - time.monotonic())
        if isinstance(claimed, RecordSnapshot):
            waited = True
            verdict = _check_existing(call=call, snapshot=claimed, policy=policy)
            if verdict == "replay":
                if claimed.completed_at is not None and claimed.completed_at >= claimed.transaction_started:
                    metrics.IDEMPOTENCY_CLAIM_CONFLICTS.inc()  # it finished while we waited: we lost a race
                return _replay_outcome(snapshot=claimed, policy=policy)
            if verdict == "busy":
                raise _Busy()
            claimed = _takeover(
                call=call, effect=Effect.INTERNAL, snapshot=claimed, policy=policy, renew=True, remaining_seconds=deadline - time.monotonic()
            )
        executed = execute(claimed)
        disposition = disposition_for_status(executed.response.status)
        if disposition is not Disposition.STORE or executed.response.status >= 400:
            raise _RolledBack(executed, disposition, dict(claimed.minted))
        _store_completed(ctx=claimed, call=call, response=executed.response)
        return _executed_outcome(call=call, executed=executed, stored=True)

    try:
        for _ in range(MAX_ROUNDS):
            try:
                outcome = _in_a_transaction(round_, operation=f"idempotency.{call.scope}")
            except _Again:
                continue
            except _Busy:
                if time.monotonic() >= deadline:
                    raise _WaitTimedOut() from None
                time.sleep(min(POLL_INTERVAL_SECONDS, max(0.0, deadline - time.monotonic())))
                continue
            except _RolledBack as rolled_back:
                if rolled_back.disposition is Disposition.FAIL:
                    _record_failed(call=call)
                if rolled_back.disposition is not Disposition.STORE:
                    return _executed_outcome(call=call, executed=rolled_back.executed, stored=False)
                stored = _store_refusal(call=call, policy=policy, refused=rolled_back, deadline=deadline)
                if stored is None:
                    continue
                return stored
            if outcome.replayed:
                metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
                if outcome.replay_until is not None:
                    replay_cache_set(
                        principal_id=call.principal_id, key=call.key,
                        entry=CachedResponse(
                            fingerprint=call.fingerprint, status=outcome.response.status, headers=outcome.response.headers,
                            body=outcome.response.body, request_id=outcome.original_request_id, replay_until=outcome.replay_until.timestamp(),
                        ),
                    )
            return outcome
        raise _WaitTimedOut()
    except _WaitTimedOut:
        return _in_use_or_replay(call=call, policy=policy)
    except (IdempotencyError, Unavailable):
        raise
    except DatabaseError as exc:
        if is_connection_failure(exc):
            raise _fail_closed() from exc
        _record_failed(call=call)
        raise
    except Exception:
        _record_failed(call=call)
        raise
    finally:
        if waited:
            metrics.IDEMPOTENCY_INFLIGHT_WAIT_SECONDS.observe(time.monotonic() - started)


def _store_refusal(*, call: IdempotentCall, policy: IdempotencyPolicy, refused: _RolledBack, deadline: float) -> Outcome | None:
    """After a refusal rolled back the view's writes: claim again and store the refusal
    alone. None if someone else holds or finished the key meanwhile (the next round replays
    or waits for it). Locks: the claim row."""

    def write() -> Outcome | None:
        claimed = _claim(call=call, effect=Effect.INTERNAL, policy=policy, remaining_seconds=deadline - time.monotonic())
        if isinstance(claimed, RecordSnapshot):
            if _check_existing(call=call, snapshot=claimed, policy=policy) in ("replay", "busy"):
                return None
            claimed = _takeover(
                call=call, effect=Effect.INTERNAL, snapshot=claimed, policy=policy, renew=True, remaining_seconds=deadline - time.monotonic()
            )
        claimed.minted = dict(refused.minted)
        _store_completed(ctx=claimed, call=call, response=refused.executed.response)
        return _executed_outcome(call=call, executed=refused.executed, stored=True)

    try:
        return run_atomic(write, operation=f"idempotency.{call.scope}.refusal")
    except _Again:
        return None


def _in_use_or_replay(*, call: IdempotentCall, policy: IdempotencyPolicy) -> Outcome:
    """After the wait budget: one last look (it may have just finished), else 409."""
    try:
        snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    except DatabaseError as exc:
        if is_connection_failure(exc):
            raise _fail_closed() from exc
        raise
    if snapshot is not None and _check_existing(call=call, snapshot=snapshot, policy=policy) == "replay":
        metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
        return _replay_outcome(snapshot=snapshot, policy=policy)
    metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc()
    raise IdempotencyKeyInUse(retry_after=min(_retry_after(snapshot), 60))


def _record_failed(*, call: IdempotentCall) -> None:
    """Best effort, after the rollback: a failed_retryable record keeps the key bound to its
    fingerprint and shows operators the failure; an existing record is left as it is."""

    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                FAILED_INSERT_SQL,
                [call.principal_id, call.key, call.scope, Effect.INTERNAL, call.fingerprint, call.request_id, call.method[:10], call.path[:512]],
            )

    _best_effort(lambda: _in_a_transaction(write, operation="idempotency.record_failed"))


# --- External effects -------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A committed in-flight claim: the holder must finish with the same fence."""

    context: IdempotencyContext


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
    """Claim (principal, key) for an external effect and COMMIT, in one transaction, the
    in-flight record (fence 1, or + 1 over a failed or lease-expired claim), the ids in
    `mint` ({"topup": "top"}) and what `on_claim(ctx)` writes. Returns the Claim, a replay
    Outcome, or Busy (a live lease). Raises 410/422. Locks: the record row."""

    def round_() -> Claim | Outcome | Busy:
        claimed = _claim(call=call, effect=Effect.EXTERNAL, policy=policy, remaining_seconds=policy.wait_ms / 1000.0)
        if isinstance(claimed, RecordSnapshot):
            verdict = _check_existing(call=call, snapshot=claimed, policy=policy)
            if verdict == "replay":
                return _replay_outcome(snapshot=claimed, policy=policy)
            if verdict == "busy" and not claimed.lease_expired:
                return Busy(retry_after=_retry_after(claimed))
            claimed = _takeover(
                call=call, effect=Effect.EXTERNAL, snapshot=claimed, policy=policy, renew=verdict == "renew",
                remaining_seconds=policy.wait_ms / 1000.0,
            )
            if verdict == "busy":
                metrics.IDEMPOTENCY_LEASE_TAKEOVERS.inc()
        for name, prefix in (mint or {}).items():
            claimed.mint(name, prefix)
        if on_claim is not None:
            on_claim(claimed)
        _in_flight(claimed.record_id or 0, claimed.fence).update(minted=claimed.minted)
        return Claim(context=claimed)

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
            raise _fail_closed() from exc
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
    """Fenced completion: run `effect()` (the holder's own final writes) and store `response`
    in one transaction, only if our fence is still current. False if it moved (our lease
    was taken over): a stale writer changes nothing. Locks: the record row."""
    context = ctx or IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=record_id, fence=fence)
    if ctx is None:
        existing = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
        if existing is not None and existing.id == record_id:
            context.minted = dict(existing.minted)

    def produce() -> Executed:
        if effect is not None:
            effect()
        return Executed(response=response)

    return idempotency_complete_produced(ctx=context, call=call, produce=produce) is not None


def idempotency_complete_produced(*, ctx: IdempotencyContext, call: IdempotentCall, produce: Callable[[], Executed]) -> Executed | None:
    """In ONE transaction: lock the record if in flight under our fence, run `produce()` (the
    final writes; it may run again on a conflict, so database only) and store the response
    it returns (2xx or 402). None if the fence moved: nothing `produce` wrote is kept.
    Locks: the record row, then whatever `produce` takes."""
    record_id = ctx.record_id
    assert record_id is not None

    def write() -> Executed:
        if not idempotency_record_fence_lock(record_id=record_id, fence=ctx.fence, in_flight=True):
            raise _stale(record_id, ctx.fence)
        executed = produce()
        if disposition_for_status(executed.response.status) is not Disposition.STORE:
            raise ValueError(f"a produced completion must be stored (2xx or 402), not {executed.response.status}")
        _store_completed(ctx=ctx, call=call, response=executed.response)
        return executed

    try:
        return run_atomic(write, operation="idempotency.complete")
    except StaleFence:
        return None


def _in_flight(record_id: int, fence: int) -> QuerySet[IdempotencyRecord]:
    return IdempotencyRecord.objects.filter(id=record_id, fence=fence, state=RecordState.IN_FLIGHT)


def idempotency_fail(*, record_id: int, fence: int) -> bool:
    """in_flight -> failed_retryable if `fence` is current (the next retry executes again)."""
    return _in_flight(record_id, fence).update(state=RecordState.FAILED_RETRYABLE, lease_expires_at=None, updated=Now()) == 1


def idempotency_release(*, record_id: int, fence: int, effect: Callable[[], None] | None = None) -> bool:
    """Drop an in-flight claim whose request failed validation (nothing stored). `effect`
    (the holder's undo of what its `on_claim` wrote) runs in the same transaction, only if
    the fence was still ours."""

    def write() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(RELEASE_SQL, [record_id, fence])
            deleted: int = cursor.rowcount
        if deleted and effect is not None:
            effect()
        return deleted == 1

    return run_atomic(write, operation="idempotency.release")


def idempotency_lease_takeover(
    *, principal_id: str, key: str, lease_seconds: int, include_failed: bool = False
) -> IdempotencyContext | None:
    """A recovery's takeover, committed: fence + 1 and a new lease on an in-flight record
    whose lease expired (or, with `include_failed`, a failed_retryable one, whose outcome a
    recovery must still learn). None if the lease is live or the record gone or finished.
    Locks: the record row."""

    def write() -> IdempotencyContext | None:
        with connection.cursor() as cursor:
            cursor.execute(LEASE_TAKEOVER_SQL, [lease_seconds, principal_id, key, include_failed])
            row = cursor.fetchone()
        return None if row is None else _taken_over(principal_id=principal_id, key=key, record_id=int(row[2]), row=row)

    ctx = run_atomic(write, operation="idempotency.takeover")
    if ctx is not None:
        metrics.IDEMPOTENCY_LEASE_TAKEOVERS.inc()
    return ctx


def idempotency_fence_assert(*, record_id: int, fence: int) -> None:
    """Lock the record and check we still hold `fence`. Needs: an open transaction (the
    holder's own). Raises StaleFence, so the holder's writes in that transaction roll back."""
    if not idempotency_record_fence_lock(record_id=record_id, fence=fence):
        raise _stale(record_id, fence)


def idempotency_execute_external(
    *,
    call: IdempotentCall,
    policy: IdempotencyPolicy,
    execute: Callable[[IdempotencyContext], Executed],
    mint: dict[str, str] | None = None,
    on_claim: Callable[[IdempotencyContext], None] | None = None,
    on_release: Callable[[IdempotencyContext], None] | None = None,
) -> Outcome:
    """Claim (committed with what `on_claim` writes; it runs again on every takeover, so it
    must get-or-create), run `execute` outside any transaction, then complete with a fenced
    compare-and-set, or inside `ctx.complete_with` when `execute` sets it. If our lease was
    taken over meanwhile, we answer what the record holds (or 409). A discarded 4xx releases
    the claim and runs `on_release(ctx)` in that transaction."""
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
    record_id = ctx.record_id
    assert record_id is not None

    def fail() -> None:
        _best_effort(lambda: idempotency_fail(record_id=record_id, fence=ctx.fence))

    try:
        executed = execute(ctx)
        produced = None if ctx.complete_with is None else idempotency_complete_produced(ctx=ctx, call=call, produce=ctx.complete_with)
    except Exception:
        fail()
        raise
    if ctx.complete_with is not None:
        if produced is None:
            return _superseded_answer(call=call, policy=policy)
        return _executed_outcome(call=call, executed=produced, stored=True)
    disposition = disposition_for_status(executed.response.status)
    if disposition is Disposition.DISCARD:
        undo = None if on_release is None else (lambda: on_release(ctx))
        _best_effort(lambda: idempotency_release(record_id=record_id, fence=ctx.fence, effect=undo))
        return _executed_outcome(call=call, executed=executed, stored=False)
    if disposition is Disposition.FAIL:
        fail()
        return _executed_outcome(call=call, executed=executed, stored=False)
    if idempotency_complete(record_id=record_id, fence=ctx.fence, call=call, response=executed.response, ctx=ctx):
        return _executed_outcome(call=call, executed=executed, stored=True)
    return _superseded_answer(call=call, policy=policy)


def _superseded_answer(*, call: IdempotentCall, policy: IdempotencyPolicy) -> Outcome:
    """Our lease was taken over: the new holder's result is the answer (or 409 meanwhile)."""
    snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    if snapshot is not None and snapshot.state == RecordState.COMPLETED and snapshot.fingerprint == call.fingerprint:
        metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
        return _replay_outcome(snapshot=snapshot, policy=policy)
    metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc()
    raise IdempotencyKeyInUse()


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
    """Run `fn(ctx)` at most once for (principal_id, key) in the current tenant, for tasks
    and commands with their own keys (principal_id e.g. "task:relay"); the fingerprint is
    `fingerprint`, else that of (scope, principal_id, payload). `fn`'s JSON-serialisable
    value is stored, and every call returns it decoded. Internal: `fn` runs in the claim's
    transaction (locks: the claim row, then `fn`'s); external: outside one. If `fn` raises,
    the record is left failed_retryable and the exception propagates."""
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
PURGE_MAX_BATCHES = 1000


def idempotency_maintenance_run(*, batch_size: int = PURGE_BATCH) -> int:
    """One tenant's housekeeping: delete records past both windows in short batches (SKIP
    LOCKED: live traffic is never blocked; in-flight records belong to the orphan recovery),
    then publish how many in-flight records are past their lease. Returns the number
    purged. Locks: each purge batch's rows."""
    policy = idempotency_policy_get()
    horizon = policy.replay_window_seconds + policy.tombstone_window_seconds
    purged = 0

    def batch() -> int:
        with connection.cursor() as cursor:
            cursor.execute(PURGE_SQL, [horizon, batch_size])
            return int(cursor.rowcount)

    for _ in range(PURGE_MAX_BATCHES):
        deleted = run_atomic(batch, operation="idempotency.purge")
        purged += deleted
        if deleted < batch_size:
            break
    schema_name = str(getattr(connection, "schema_name", "public"))
    metrics.IDEMPOTENCY_STUCK_INFLIGHT.labels(tenant=schema_name).set(idempotency_stuck_count())
    return purged
