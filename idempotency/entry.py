"""The ways into the idempotency engine (SPEC 6; docs/ARCHITECTURE.md). Call inside the
tenant's schema.

- `idempotency_execute`: claim, effect and stored response in one transaction; a
  duplicate's INSERT waits on the winner's uncommitted row, bounded by `lock_timeout`.
- `idempotency_execute_external`: the claim (lease, fence) commits first, the call runs
  outside any transaction, and completion is a compare-and-set on the fence.
- `idempotency_run`: either of them for tasks and commands with keys of their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection, transaction

from idempotency import metrics
from idempotency.canonical import fingerprint_of_value
from idempotency.engine import (
    Disposition,
    Executed,
    IdempotencyContext,
    IdempotentCall,
    LockWaitTimedOut,
    RecordMoved,
    StoredResponse,
    disposition_for_status,
    idempotency_complete_produced,
    idempotency_fail,
    record_claim,
    record_complete,
    record_failed,
    record_minted_set,
    record_release,
    record_take_over,
)
from idempotency.errors import IdempotencyError, IdempotencyKeyExpired, IdempotencyKeyInUse, IdempotencyKeyReused
from idempotency.hotpath import CachedResponse, ReplayPrefetch, replay_cache_get, replay_cache_set
from idempotency.models import Effect, RecordState
from idempotency.selectors import IdempotencyPolicy, RecordSnapshot, idempotency_policy_get, idempotency_record_snapshot
from wallets import ids
from wallets import metrics as wallet_metrics
from wallets.errors import TallyError, Unavailable
from wallets.transactions import is_connection_failure, run_atomic

POLL_INTERVAL_SECONDS = 0.02
MAX_ROUNDS = 20  # a round ends early only when the record changed under us; 20 is generous
_BEST_EFFORT = (DatabaseError, TallyError)  # what a best-effort write after the answer may fail with
T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    response: StoredResponse
    replayed: bool
    original_request_id: str
    stored: bool
    value: Any = None  # the executor's value when executed now, else None
    replay_until: datetime | None = None  # end of the replay window, on replays from PostgreSQL


# --- Control flow inside a round (never escape this module) ------------------------------


class _RolledBack(Exception):
    """The answer is not stored with the view's writes: roll them back, then act on the
    disposition (a STORE here is a 402 refusal, stored alone in a second transaction)."""

    def __init__(self, executed: Executed, disposition: Disposition, minted: dict[str, str]) -> None:
        self.executed = executed
        self.disposition = disposition
        self.minted = minted


class _Busy(Exception):
    """Another holder's in-flight claim is committed: poll until it resolves or we give up."""


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
        claimed = record_claim(
            call=call, effect=Effect.INTERNAL, lease_seconds=policy.lease_seconds, remaining_seconds=deadline - time.monotonic()
        )
        if isinstance(claimed, RecordSnapshot):
            waited = True
            verdict = _check_existing(call=call, snapshot=claimed, policy=policy)
            if verdict == "replay":
                if claimed.completed_at is not None and claimed.completed_at >= claimed.transaction_started:
                    metrics.IDEMPOTENCY_CLAIM_CONFLICTS.inc()  # it finished while we waited: we lost a race
                return _replay_outcome(snapshot=claimed, policy=policy)
            if verdict == "busy":
                raise _Busy()
            claimed = record_take_over(
                call=call, effect=Effect.INTERNAL, snapshot=claimed, lease_seconds=policy.lease_seconds, renew=True,
                remaining_seconds=deadline - time.monotonic(),
            )
        executed = execute(claimed)
        disposition = disposition_for_status(executed.response.status)
        if disposition is not Disposition.STORE or executed.response.status >= 400:
            raise _RolledBack(executed, disposition, dict(claimed.minted))
        record_complete(ctx=claimed, call=call, response=executed.response)
        return _executed_outcome(call=call, executed=executed, stored=True)

    try:
        for _ in range(MAX_ROUNDS):
            try:
                outcome = _in_a_transaction(round_, operation=f"idempotency.{call.scope}")
            except RecordMoved:
                continue
            except _Busy:
                if time.monotonic() >= deadline:
                    raise LockWaitTimedOut() from None
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
        raise LockWaitTimedOut()
    except LockWaitTimedOut:
        return _in_use_or_replay(call=call, policy=policy)
    except (IdempotencyError, Unavailable):
        raise
    except Exception as exc:
        if isinstance(exc, DatabaseError) and is_connection_failure(exc):
            raise _fail_closed() from exc
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
        claimed = record_claim(
            call=call, effect=Effect.INTERNAL, lease_seconds=policy.lease_seconds, remaining_seconds=deadline - time.monotonic()
        )
        if isinstance(claimed, RecordSnapshot):
            if _check_existing(call=call, snapshot=claimed, policy=policy) in ("replay", "busy"):
                return None
            claimed = record_take_over(
                call=call, effect=Effect.INTERNAL, snapshot=claimed, lease_seconds=policy.lease_seconds, renew=True,
                remaining_seconds=deadline - time.monotonic(),
            )
        claimed.minted = dict(refused.minted)
        record_complete(ctx=claimed, call=call, response=refused.executed.response)
        return _executed_outcome(call=call, executed=refused.executed, stored=True)

    try:
        return run_atomic(write, operation=f"idempotency.{call.scope}.refusal")
    except RecordMoved:
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
    with suppress(*_BEST_EFFORT):
        _in_a_transaction(lambda: record_failed(call=call), operation="idempotency.record_failed")


@dataclass(frozen=True)
class Claim:
    """A committed in-flight claim: the holder must finish with the same fence."""

    context: IdempotencyContext


@dataclass(frozen=True)
class Busy:
    retry_after: int


def _claim_external(
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
        claimed = record_claim(call=call, effect=Effect.EXTERNAL, lease_seconds=policy.lease_seconds, remaining_seconds=policy.wait_ms / 1000.0)
        if isinstance(claimed, RecordSnapshot):
            verdict = _check_existing(call=call, snapshot=claimed, policy=policy)
            if verdict == "replay":
                return _replay_outcome(snapshot=claimed, policy=policy)
            if verdict == "busy" and not claimed.lease_expired:
                return Busy(retry_after=_retry_after(claimed))
            claimed = record_take_over(
                call=call, effect=Effect.EXTERNAL, snapshot=claimed, lease_seconds=policy.lease_seconds, renew=verdict == "renew",
                remaining_seconds=policy.wait_ms / 1000.0,
            )
            if verdict == "busy":
                metrics.IDEMPOTENCY_LEASE_TAKEOVERS.inc()
        for name, prefix in (mint or {}).items():
            claimed.mint(name, prefix)
        if on_claim is not None:
            on_claim(claimed)
        record_minted_set(claimed)
        return Claim(context=claimed)

    try:
        for _ in range(MAX_ROUNDS):
            try:
                result = run_atomic(round_, operation=f"idempotency.claim.{call.scope}")
            except RecordMoved:
                continue
            if isinstance(result, Outcome):
                metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
            return result
        return Busy(retry_after=1)
    except LockWaitTimedOut:
        return Busy(retry_after=1)
    except DatabaseError as exc:
        if is_connection_failure(exc):
            raise _fail_closed() from exc
        raise


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
            claimed = _claim_external(call=call, policy=policy, mint=mint, on_claim=on_claim)
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
        with suppress(*_BEST_EFFORT):
            idempotency_fail(record_id=record_id, fence=ctx.fence)

    try:
        executed = execute(ctx)
        produced = None if ctx.complete_with is None else idempotency_complete_produced(ctx=ctx, call=call, produce=ctx.complete_with)
    except Exception:
        fail()
        raise
    if ctx.complete_with is None:
        disposition = disposition_for_status(executed.response.status)
        if disposition is not Disposition.STORE:
            if disposition is Disposition.DISCARD:
                undo = None if on_release is None else (lambda: on_release(ctx))
                with suppress(*_BEST_EFFORT):
                    record_release(record_id=record_id, fence=ctx.fence, effect=undo)
            else:
                fail()
            return _executed_outcome(call=call, executed=executed, stored=False)
        produced = idempotency_complete_produced(ctx=ctx, call=call, produce=lambda: executed)
    if produced is None:
        return _superseded_answer(call=call, policy=policy)
    return _executed_outcome(call=call, executed=produced, stored=True)


def _superseded_answer(*, call: IdempotentCall, policy: IdempotencyPolicy) -> Outcome:
    """Our lease was taken over: the new holder's result is the answer (or 409 meanwhile)."""
    snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    if snapshot is not None and snapshot.state == RecordState.COMPLETED and snapshot.fingerprint == call.fingerprint:
        metrics.IDEMPOTENCY_REPLAYS.labels(source="postgres").inc()
        return _replay_outcome(snapshot=snapshot, policy=policy)
    metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc()
    raise IdempotencyKeyInUse()


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
