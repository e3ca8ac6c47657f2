"""The idempotency engine (SPEC 6; docs/ARCHITECTURE.md): one record per (principal, key),
claimed, completed, released or failed, and taken over when its lease runs out; every
transition is a compare-and-set on the record's fence, so a holder whose lease was taken
over changes nothing. Call inside the tenant's schema; the ways in are in `entry`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Now

from idempotency import metrics
from idempotency.errors import StaleFence
from idempotency.hotpath import claim_insert, completion_store
from idempotency.locks import idempotency_record_fence_lock
from idempotency.models import Effect, IdempotencyRecord, RecordState
from idempotency.selectors import RecordSnapshot, idempotency_policy_get, idempotency_record_snapshot, idempotency_stuck_count, str_dict_of
from wallets import ids
from wallets.transactions import run_atomic, sqlstate_of

LOCK_NOT_AVAILABLE = "55P03"
FAILED_RECORD_LOCK_TIMEOUT_SECONDS = 1.0


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class IdempotentCall:
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
    response: StoredResponse
    value: Any = None  # for the executor's caller


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


class RecordMoved(Exception):
    """The record changed between our statements (purged, taken over): start a new round."""


class LockWaitTimedOut(Exception):
    """A row lock was waited on past the transaction's lock_timeout."""


def _ms(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}ms"


def _lock_timeout_set(seconds: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [_ms(seconds)])


def _stale(record_id: int | None, fence: int) -> StaleFence:
    return StaleFence(f"record {record_id}: fence {fence} is no longer current")


def _in_flight(record_id: int, fence: int) -> QuerySet[IdempotencyRecord]:
    return IdempotencyRecord.objects.filter(id=record_id, fence=fence, state=RecordState.IN_FLIGHT)


# --- Claim, take over, complete (the caller's open transaction) ------------------------------


@contextmanager
def _lock_wait_bounded() -> Iterator[None]:
    try:
        yield
    except DatabaseError as exc:
        if sqlstate_of(exc) == LOCK_NOT_AVAILABLE:
            raise LockWaitTimedOut() from exc
        raise


def record_claim(*, call: IdempotentCall, effect: str, lease_seconds: int, remaining_seconds: float) -> IdempotencyContext | RecordSnapshot:
    """Claim (principal, key) with fence 1 in the open transaction, else read the record that
    holds it (RecordMoved if gone). Waits on an uncommitted claim at most `remaining_seconds`
    (LockWaitTimedOut); the transaction keeps that lock_timeout, so an effect stuck on a lock
    longer than a duplicate may wait gets 55P03 (retried whole), and no round trip resets it."""
    with _lock_wait_bounded():
        record_id = claim_insert(
            lock_timeout=_ms(remaining_seconds), principal_id=call.principal_id, key=call.key, scope=call.scope, effect=effect,
            fingerprint=call.fingerprint, lease_seconds=lease_seconds, request_id=call.request_id, method=call.method[:10],
            path=call.path[:512],
        )
    if record_id is not None:
        return IdempotencyContext(principal_id=call.principal_id, key=call.key, record_id=record_id, fence=1)
    snapshot = idempotency_record_snapshot(principal_id=call.principal_id, key=call.key)
    if snapshot is None:
        raise RecordMoved()
    return snapshot


def _fence_bumped(
    matching: QuerySet[IdempotencyRecord], *, record: QuerySet[IdempotencyRecord], principal_id: str, key: str, lease_seconds: float,
    **changes: Any,
) -> IdempotencyContext | None:
    """In the open transaction: the record `matching` selects in flight again with fence + 1,
    a new lease and `changes`; its context (read back through `record` under our row lock),
    or None if nothing matched. Locks: the record row."""
    bumped = matching.update(
        fence=F("fence") + 1, state=RecordState.IN_FLIGHT, lease_expires_at=Now() + timedelta(seconds=lease_seconds), updated=Now(), **changes
    )
    if not bumped:
        return None
    record_id, fence, minted = record.values_list("id", "fence", "minted").get()
    return IdempotencyContext(
        principal_id=principal_id, key=key, record_id=int(record_id), fence=int(fence), minted=str_dict_of(minted), takeover=True
    )


def record_take_over(
    *, call: IdempotentCall, effect: str, snapshot: RecordSnapshot, lease_seconds: int, renew: bool, remaining_seconds: float
) -> IdempotencyContext:
    """Fenced takeover (fence + 1) in the open transaction; `renew`: a brand-new claim (past
    both windows: new claim time, no minted ids). RecordMoved when the fence or the state
    moved since `snapshot` (a late holder that completed it meanwhile must be replayed, not
    reopened). Locks: the record row, waited on at most `remaining_seconds`."""
    _lock_timeout_set(remaining_seconds)
    renewed: dict[str, Any] = {"created": Now(), "minted": {}} if renew else {}
    with _lock_wait_bounded():
        taken = _fence_bumped(
            IdempotencyRecord.objects.filter(id=snapshot.id, fence=snapshot.fence, state=snapshot.state),
            record=IdempotencyRecord.objects.filter(id=snapshot.id), principal_id=call.principal_id, key=call.key,
            lease_seconds=lease_seconds, fingerprint=call.fingerprint, request_id=call.request_id, scope=call.scope, effect=effect,
            method=call.method[:10], path=call.path[:512], response_status=None, response_headers=None, response_body=None,
            completed_at=None, **renewed,
        )
    if taken is None:
        raise RecordMoved()
    return taken


def record_complete(*, ctx: IdempotencyContext, call: IdempotentCall, response: StoredResponse) -> None:
    """Fenced completion in the open transaction (StaleFence if the fence moved). Locks: the record row."""
    assert ctx.record_id is not None
    stored = completion_store(
        record_id=ctx.record_id, fence=ctx.fence, status=response.status, headers=response.headers, body=response.body,
        minted=ctx.minted, request_id=call.request_id,
    )
    if not stored:
        raise _stale(ctx.record_id, ctx.fence)


def record_minted_set(ctx: IdempotencyContext) -> None:
    _in_flight(ctx.record_id or 0, ctx.fence).update(minted=ctx.minted)


def record_failed(*, call: IdempotentCall) -> None:
    """In the open transaction, a failed_retryable record for a key nobody holds (it keeps the
    key bound to its fingerprint); an existing record is left as it is, and a live claim is
    waited on at most a second."""
    _lock_timeout_set(FAILED_RECORD_LOCK_TIMEOUT_SECONDS)
    failed = IdempotencyRecord(
        principal_id=call.principal_id, key=call.key, scope=call.scope, effect=Effect.INTERNAL, fingerprint=call.fingerprint,
        state=RecordState.FAILED_RETRYABLE, fence=1, request_id=call.request_id, method=call.method[:10], path=call.path[:512],
        minted={}, created=Now(), updated=Now(),
    )
    IdempotencyRecord.objects.bulk_create([failed], ignore_conflicts=True)


def record_release(*, record_id: int, fence: int, effect: Callable[[], None] | None = None) -> bool:
    """Drop an in-flight claim whose request failed validation (nothing stored). `effect`
    (the holder's undo of what its `on_claim` wrote) runs in the same transaction, only if
    the fence was still ours. Locks: the record row."""

    def write() -> bool:
        # One DELETE filtered on the fence: Django's delete() would read the claim, then
        # delete it by id (a receiver listens for deletions), and a takeover in between
        # would lose its claim and its minted ids.
        deleted = _in_flight(record_id, fence)._raw_delete(connection.alias)
        if deleted and effect is not None:
            effect()
        return deleted == 1

    return run_atomic(write, operation="idempotency.release")


# --- Fenced completion, failure and lease takeover (transactions of their own) ---------------


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
        record_complete(ctx=ctx, call=call, response=executed.response)
        return executed

    try:
        return run_atomic(write, operation="idempotency.complete")
    except StaleFence:
        return None


def idempotency_fail(*, record_id: int, fence: int) -> bool:
    """in_flight -> failed_retryable if `fence` is current (the next retry executes again)."""
    return _in_flight(record_id, fence).update(state=RecordState.FAILED_RETRYABLE, lease_expires_at=None, updated=Now()) == 1


def idempotency_lease_takeover(
    *, principal_id: str, key: str, lease_seconds: int, include_failed: bool = False
) -> IdempotencyContext | None:
    """A recovery's takeover, committed: fence + 1 and a new lease on an in-flight record
    whose lease expired (or, with `include_failed`, a failed_retryable one, whose outcome a
    recovery must still learn). None if the lease is live or the record gone or finished.
    Locks: the record row."""
    takeable = Q(state=RecordState.IN_FLIGHT, lease_expires_at__lte=Now())
    if include_failed:
        takeable |= Q(state=RecordState.FAILED_RETRYABLE)
    records = IdempotencyRecord.objects.filter(principal_id=principal_id, key=key)

    def write() -> IdempotencyContext | None:
        return _fence_bumped(records.filter(takeable), record=records, principal_id=principal_id, key=key, lease_seconds=lease_seconds)

    ctx = run_atomic(write, operation="idempotency.takeover")
    if ctx is not None:
        metrics.IDEMPOTENCY_LEASE_TAKEOVERS.inc()
    return ctx


PURGE_BATCH = 1000
PURGE_MAX_BATCHES = 1000


def idempotency_maintenance_run(*, batch_size: int = PURGE_BATCH) -> int:
    """One tenant's housekeeping: delete records past both windows in short batches (SKIP
    LOCKED: live traffic is never blocked; in-flight records belong to the orphan recovery),
    then publish how many in-flight records are past their lease. Returns the number
    purged. Locks: each purge batch's rows."""
    policy = idempotency_policy_get()
    horizon = timedelta(seconds=policy.replay_window_seconds + policy.tombstone_window_seconds)
    purged = 0

    def batch() -> int:
        expired = (
            IdempotencyRecord.objects.filter(created__lt=Now() - horizon).exclude(state=RecordState.IN_FLIGHT)
            .order_by("created").select_for_update(skip_locked=True).values("id")[:batch_size]
        )
        # One DELETE of the batch, as record_release: no read of every row first.
        return IdempotencyRecord.objects.filter(id__in=expired)._raw_delete(connection.alias)

    for _ in range(PURGE_MAX_BATCHES):
        deleted = run_atomic(batch, operation="idempotency.purge")
        purged += deleted
        if deleted < batch_size:
            break
    schema_name = str(getattr(connection, "schema_name", "public"))
    metrics.IDEMPOTENCY_STUCK_INFLIGHT.labels(tenant=schema_name).set(idempotency_stuck_count())
    return purged
