"""The phase transitions of a staged migration in the current tenant.

    absent -> expand -> expanded -> backfill -> backfilled -> verify -> verified
           -> switch-reads -> reads_switched -> contract -> contracting -> contracted

Every transition is idempotent (a phase already reached is a no-op that says so);
`rollback` goes back one phase until contract starts. Callers hold
`wallets.locks.staged_run_lock`. Locks: the state row (`staged_state_lock`) for each
transition; the backfill's batches take what the migration's `backfill_batch` says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from wallets.locks import staged_state_lock
from wallets.models import StagedMigrationState, StagedPhase
from wallets.staged.phases import PHASE_ORDER, phase_index, staged_fence_seconds, staged_phase_forget
from wallets.staged.spec import BatchResult, StagedMigration, StagedMigrationRefused
from wallets.transactions import run_atomic


@dataclass(frozen=True)
class Outcome:
    message: str
    changed: bool
    ok: bool = True


ProgressFn = Callable[[int, int, float], None]
_BACKFILL_RESET: dict[str, Any] = {
    "cursor": "", "rows_done": 0, "rows_written": 0, "backfill_started_at": None, "backfill_finished_at": None, "backfill_seconds": 0.0,
}


def staged_state(*, migration: StagedMigration) -> StagedMigrationState:
    """The state row (made at `absent` on first use)."""
    return StagedMigrationState.objects.get_or_create(name=migration.name)[0]


def _at_least(state: StagedMigrationState, phase: StagedPhase) -> bool:
    return phase_index(state.phase) >= phase_index(phase)


def _move(state: StagedMigrationState, to: StagedPhase, *, note: str = "", **fields: Any) -> None:
    """Set the phase (and `fields`) on a locked state row, appending to its history."""
    now = timezone.now()
    state.history = [*state.history, {"from": state.phase, "to": str(to), "at": now.isoformat(), "note": note}][-50:]
    state.phase = to
    state.phase_changed_at = now
    for name, value in fields.items():
        setattr(state, name, value)
    state.save()
    transaction.on_commit(staged_phase_forget)


def _transition(migration: StagedMigration, decide: Callable[[StagedMigrationState], Outcome]) -> Outcome:
    with transaction.atomic():
        return decide(staged_state_lock(name=migration.name))


def _fence_wait(changed_at: datetime) -> None:
    """Sleep until every process has seen a phase change made at `changed_at`."""
    remaining = (changed_at - timezone.now()).total_seconds() + staged_fence_seconds()
    if remaining > 0:
        time.sleep(remaining)


def staged_expand(*, migration: StagedMigration) -> Outcome:
    """absent -> expanded: the new representation exists and services write it too."""
    state = staged_state(migration=migration)
    if state.discard_pending:
        _discard(migration, state)
    if _at_least(state, StagedPhase.EXPANDED):
        return Outcome(f"already {state.phase}: expand is a no-op", changed=False)
    migration.expand()

    def decide(locked: StagedMigrationState) -> Outcome:
        if locked.phase != StagedPhase.ABSENT:
            return Outcome(f"already {locked.phase}: expand is a no-op", changed=False)
        _move(locked, StagedPhase.EXPANDED, **_BACKFILL_RESET, rows_total=0, verify_ok=None, verify_report={})
        return Outcome("expanded: dual writes on (the backfill waits until every process has seen it)", changed=True)

    return _transition(migration, decide)


def staged_start_contracted(*, migration: StagedMigration) -> Outcome:
    """absent -> contracted at once, for a tenant with no old data (one just created)."""

    def decide(locked: StagedMigrationState) -> Outcome:
        if locked.phase != StagedPhase.ABSENT:
            return Outcome(f"already {locked.phase}: nothing to start", changed=False)
        if migration.backfill_total():
            raise StagedMigrationRefused("there is data to migrate: run the phases")
        _move(locked, StagedPhase.CONTRACTED, note="no old data: new representation only")
        return Outcome("contracted: nothing to migrate", changed=True)

    return _transition(migration, decide)


def staged_backfill(
    *, migration: StagedMigration, batch: int = 500, rows_per_second: float = 0.0, dry_run: bool = False, progress: ProgressFn | None = None
) -> Outcome:
    """expanded -> backfilled: once every process dual-writes, copy every old row in batches
    that each commit the cursor (a killed backfill resumes). `rows_per_second` > 0
    throttles; `dry_run` writes nothing, not even the cursor."""
    state = staged_state(migration=migration)
    if not _at_least(state, StagedPhase.EXPANDED):
        raise StagedMigrationRefused(f"phase is {state.phase}: run expand first")
    if state.phase != StagedPhase.EXPANDED:
        return Outcome(f"already {state.phase}: backfill is a no-op", changed=False)
    _fence_wait(state.phase_changed_at)
    total = migration.backfill_total()
    if not dry_run and state.backfill_started_at is None:
        StagedMigrationState.objects.filter(pk=state.pk).update(backfill_started_at=timezone.now(), rows_total=total)
    cursor: str | None = state.cursor
    done, written, seen_this_run = state.rows_done, state.rows_written, 0
    started = time.monotonic()
    while cursor is not None:

        def one_batch(after: str = cursor, done: int = done, written: int = written) -> BatchResult:
            result = migration.backfill_batch(after=after, limit=batch, dry_run=dry_run)
            if not dry_run:
                StagedMigrationState.objects.filter(pk=migration.name).update(
                    cursor=result.cursor or "", rows_done=done + result.rows_seen, rows_written=written + result.rows_written,
                    backfill_seconds=state.backfill_seconds + (time.monotonic() - started),
                )
            return result

        result = run_atomic(one_batch, operation="staged_backfill")
        done, written, seen_this_run = done + result.rows_seen, written + result.rows_written, seen_this_run + result.rows_seen
        cursor = result.cursor
        elapsed = time.monotonic() - started
        if progress is not None:
            progress(done, max(total, done), seen_this_run / elapsed if elapsed > 0 else 0.0)
        if rows_per_second > 0 and cursor is not None:
            ahead = seen_this_run / rows_per_second - elapsed
            if ahead > 0:
                time.sleep(ahead)
    seconds = time.monotonic() - started
    if dry_run:
        return Outcome(f"dry run: {seen_this_run} rows looked at, {written - state.rows_written} would be written; nothing written", changed=False)

    def decide(locked: StagedMigrationState) -> Outcome:
        if locked.phase != StagedPhase.EXPANDED:
            return Outcome(f"already {locked.phase}: backfill is a no-op", changed=False)
        _move(locked, StagedPhase.BACKFILLED, backfill_finished_at=timezone.now(), rows_total=max(total, locked.rows_done))
        return Outcome(
            f"backfilled: {locked.rows_done} rows, {locked.rows_written} written, this run {seen_this_run} rows in {seconds:.1f} s",
            changed=True,
        )

    return _transition(migration, decide)


def staged_verify(*, migration: StagedMigration) -> Outcome:
    """Compare both representations; backfilled -> verified when they are equal. A
    difference fails (ok=False) and blocks contract until a later verify passes."""
    state = staged_state(migration=migration)
    if not _at_least(state, StagedPhase.BACKFILLED):
        raise StagedMigrationRefused(f"phase is {state.phase}: backfill first")
    if _at_least(state, StagedPhase.CONTRACTING) and not migration.old_survives_contract:
        return Outcome(f"{state.phase}: the old representation is gone, nothing to compare", changed=False)
    report = migration.verify()

    def decide(locked: StagedMigrationState) -> Outcome:
        locked.verified_at, locked.verify_ok, locked.verify_report = timezone.now(), report.ok, report.as_json()
        if report.ok and locked.phase == StagedPhase.BACKFILLED:
            _move(locked, StagedPhase.VERIFIED)
        else:
            locked.save(update_fields=["verified_at", "verify_ok", "verify_report", "updated"])
        summary = ", ".join(f"{k}={v}" for k, v in report.counts.items())
        if report.ok:
            return Outcome(f"verify passed ({summary}); phase {locked.phase}", changed=True)
        return Outcome(f"verify FAILED: {len(report.differences)} differences ({summary}); first: {report.differences[:5]}", changed=True, ok=False)

    return _transition(migration, decide)


def staged_switch_reads(*, migration: StagedMigration) -> Outcome:
    """verified -> reads_switched: selectors read the new representation."""

    def decide(locked: StagedMigrationState) -> Outcome:
        if _at_least(locked, StagedPhase.READS_SWITCHED):
            return Outcome(f"already {locked.phase}: switch-reads is a no-op", changed=False)
        if locked.phase != StagedPhase.VERIFIED or locked.verify_ok is not True:
            raise StagedMigrationRefused(f"phase is {locked.phase}: reads switch only after verify has passed")
        _move(locked, StagedPhase.READS_SWITCHED)
        return Outcome("reads switched to the new representation", changed=True)

    return _transition(migration, decide)


def staged_contract(*, migration: StagedMigration) -> Outcome:
    """reads_switched -> contracting -> contracted: stop writing the old representation,
    wait until every process has seen that, then remove it (resumed if killed). Refused
    unless this tenant's last verify passed and reads have switched."""

    def begin(locked: StagedMigrationState) -> Outcome:
        if locked.phase == StagedPhase.CONTRACTED:
            return Outcome("already contracted: contract is a no-op", changed=False)
        if locked.phase == StagedPhase.CONTRACTING:
            return Outcome("resuming contract", changed=True)
        if locked.verify_ok is not True or not _at_least(locked, StagedPhase.VERIFIED):
            raise StagedMigrationRefused(f"phase is {locked.phase}: contract refused, verify has not passed on this tenant")
        if locked.phase != StagedPhase.READS_SWITCHED:
            raise StagedMigrationRefused(f"phase is {locked.phase}: contract refused, switch reads first")
        _move(locked, StagedPhase.CONTRACTING)
        return Outcome("contracting", changed=True)

    started = _transition(migration, begin)
    if not started.changed:
        return started
    _fence_wait(staged_state(migration=migration).phase_changed_at)
    migration.contract()

    def finish(locked: StagedMigrationState) -> Outcome:
        if locked.phase == StagedPhase.CONTRACTING:
            _move(locked, StagedPhase.CONTRACTED)
        return Outcome("contracted: the old representation is removed", changed=True)

    return _transition(migration, finish)


def staged_rollback(*, migration: StagedMigration) -> Outcome:
    """Go back one phase, while that is still possible (before contract)."""

    def decide(locked: StagedMigrationState) -> Outcome:
        phase = StagedPhase(locked.phase)
        if phase in (StagedPhase.CONTRACTING, StagedPhase.CONTRACTED):
            raise StagedMigrationRefused(
                f"rollback refused: phase is {phase}; contract has removed (or is removing) the old representation, "
                "so there is no earlier phase to return to. Fix forward instead."
            )
        if phase == StagedPhase.ABSENT:
            raise StagedMigrationRefused("rollback refused: phase is absent, nothing to roll back")
        back = PHASE_ORDER[phase_index(phase) - 1]
        fields = {StagedPhase.EXPANDED: _BACKFILL_RESET, StagedPhase.ABSENT: {"discard_pending": True, "verify_ok": None}}.get(back, {})
        _move(locked, back, note="rollback", **fields)
        return Outcome(f"rolled back from {phase} to {back}", changed=True)

    outcome = _transition(migration, decide)
    state = staged_state(migration=migration)
    if state.discard_pending:
        _discard(migration, state)
        outcome = Outcome(outcome.message + "; the new representation's data was discarded", changed=True)
    return outcome


def _discard(migration: StagedMigration, state: StagedMigrationState) -> None:
    """After the fence (no process dual-writes any more), discard the new data."""
    _fence_wait(state.phase_changed_at)
    migration.discard()
    StagedMigrationState.objects.filter(pk=migration.name, phase=StagedPhase.ABSENT).update(discard_pending=False)
