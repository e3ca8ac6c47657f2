"""Reconciliation runs: request one, execute it (every registered check, findings stored
in batches as they stream), and keep the beat schedule in django-celery-beat."""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from django_tenants.utils import get_public_schema_name

from reconciliation.checks.base import CheckContext
from reconciliation.locks import reconciliation_run_lock
from reconciliation.models import ReconciliationFinding, ReconciliationRun, RunStatus, RunTrigger
from reconciliation.registry import CHECKS, METRICS, Check
from tenants.signals import StagedCheck

logger = logging.getLogger(__name__)

# A broken ledger can disagree everywhere: past this many findings a check's are counted, not stored.
MAX_FINDINGS_STORED_PER_CHECK = 10_000
FINDINGS_BATCH = 500

# The task's hard time limit (tasks.py): a run "running" longer was killed, and runs again when its task is redelivered.
RUN_TIME_LIMIT_SECONDS = 1800

# The discrepancy kinds that refuse a restored schema (tenants.restore): the copy's own
# consistency, true or false of the copy alone, whichever check finds them. The others judge
# the restore point's moment against now or the outside world (outbox lag, keys in flight,
# the PSP's reports and balances) and are told to the operator, who restored that moment on
# purpose. Decided per kind, not per check: one check yields kinds of both sorts (payouts).
RESTORE_BLOCKING_KINDS = frozenset({
    "ledger_balance_mismatch", "ledger_held_mismatch", "ledger_unbalanced_transaction", "asset_not_conserved", "orphan_reference",
    "daily_total_mismatch", "fee_account_mismatch", "payouts_in_transit_mismatch",
})
SHOWN_PER_KIND = 3

SCHEDULE_NAME = "reconciliation: every tenant"
SCHEDULE_TASK = "reconciliation.run_all_tenants"
SCHEDULE_DEFAULT_HOURS = 1

Progress = Callable[[int, int, str], None]


def reconciliation_run_request(*, trigger: RunTrigger, requested_by: str = "") -> ReconciliationRun:
    """A queued run in the current tenant; the caller executes it (or enqueues it after commit)."""
    return ReconciliationRun.objects.create(trigger=trigger, requested_by=requested_by[:150])


def _check_run(run: ReconciliationRun, check: Check, ctx: CheckContext, by_kind: Tally[str]) -> dict[str, Any]:
    started = time.monotonic()
    ctx.stats = {}
    found = 0
    batch: list[ReconciliationFinding] = []
    for discrepancy in check.run(ctx):
        found += 1
        by_kind[discrepancy.kind] += 1
        if found <= MAX_FINDINGS_STORED_PER_CHECK:
            batch.append(ReconciliationFinding(
                run=run, check_name=check.name, kind=discrepancy.kind, severity=str(discrepancy.severity),
                summary=discrepancy.summary[:500], details=discrepancy.details, refs=[asdict(ref) for ref in discrepancy.refs],
            ))
        if len(batch) >= FINDINGS_BATCH:
            ReconciliationFinding.objects.bulk_create(batch)
            batch = []
    ReconciliationFinding.objects.bulk_create(batch)
    stored = min(found, MAX_FINDINGS_STORED_PER_CHECK)
    return {"findings": found, "stored": stored, "seconds": round(time.monotonic() - started, 3), "stats": ctx.stats}


def reconciliation_run_execute(
    *, run_id: int, checks: Sequence[Check] | None = None, progress: Progress | None = None, chunk_size: int = 2000
) -> ReconciliationRun:
    """Run every registered check (or `checks`) in the current tenant and store the report,
    the per-run metrics and the findings, all in one REPEATABLE READ snapshot (a payment
    committing mid-run cannot look like a discrepancy between two checks). A run finished,
    or running for less than RUN_TIME_LIMIT_SECONDS (its task delivered twice), is returned
    as is; one running longer died with its process (nothing of it committed) and runs again.

    Locks: the run row, while it is marked running (two workers given it); no business rows."""
    checks = list(CHECKS if checks is None else checks)
    with transaction.atomic():
        run = reconciliation_run_lock(run_id=run_id)
        stale = run.started_at is not None and run.started_at < timezone.now() - timedelta(seconds=RUN_TIME_LIMIT_SECONDS)
        if run.status in (RunStatus.CLEAN, RunStatus.FINDINGS) or (run.status == RunStatus.RUNNING and not stale):
            return run
        run.status, run.started_at = RunStatus.RUNNING, timezone.now()
        run.save(update_fields=["status", "started_at"])
    started = time.monotonic()
    by_kind: Tally[str] = Tally()
    try:
        owns_transaction = not connection.in_atomic_block
        with transaction.atomic():
            if owns_transaction:
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            ctx = CheckContext(now=timezone.now(), chunk_size=chunk_size)
            report: dict[str, Any] = {"checks": {}}
            for index, check in enumerate(checks):
                if progress is not None:
                    progress(index, len(checks), check.name)
                report["checks"][check.name] = _check_run(run, check, ctx, by_kind)
            metrics: dict[str, Any] = {}
            for collect in METRICS:
                metrics.update(collect(ctx=ctx))
            if progress is not None:
                progress(len(checks), len(checks), "done")
            report["by_kind"] = dict(sorted(by_kind.items()))
            run.findings_count = sum(by_kind.values())
            run.status = RunStatus.FINDINGS if run.findings_count else RunStatus.CLEAN
            run.report, run.metrics = report, metrics
            run.finished_at = timezone.now()
            run.duration_ms = int((time.monotonic() - started) * 1000)
            run.save(update_fields=["findings_count", "status", "report", "metrics", "finished_at", "duration_ms"])
    except Exception as exc:
        ReconciliationRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error=repr(exc)[:2000], finished_at=timezone.now())
        logger.exception("reconciliation run failed", extra={"run": run.pk})
        raise
    logger.info("reconciliation run finished", extra={"run": run.pk, "findings": run.findings_count, "duration_ms": run.duration_ms})
    return run


def reconciliation_restored_schema_check(**_: Any) -> StagedCheck:
    """`tenant_restore_staged`: reconcile the restored copy of a tenant (the connection is set
    to its staging schema) with every check, as `manage.py reconcile` does. The run is stored
    there, so once swapped in the tenant's history shows the check its data passed."""
    run = reconciliation_run_request(trigger=RunTrigger.COMMAND, requested_by="manage.py tenant_restore")
    run = reconciliation_run_execute(run_id=run.pk)
    blocking: list[str] = []
    notes: list[str] = []
    for kind, count in run.report["by_kind"].items():
        shown = [str(f.summary) for f in run.findings.filter(kind=kind).order_by("id")[:SHOWN_PER_KIND]]
        line = f"{kind}: {count} finding(s): " + " | ".join(shown)
        (blocking if kind in RESTORE_BLOCKING_KINDS else notes).append(line)
    return StagedCheck(blocking=tuple(blocking), notes=tuple(notes))


def reconciliation_schedule_ensure(*, hours: int = SCHEDULE_DEFAULT_HOURS) -> Any:
    """The django-celery-beat PeriodicTask that fans reconciliation out to every tenant:
    created if missing, never overwritten (staff edit it; CELERY_BEAT_SCHEDULE would reset it)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    existing = PeriodicTask.objects.filter(name=SCHEDULE_NAME).first()
    if existing is not None:
        return existing
    interval, _ = IntervalSchedule.objects.get_or_create(every=hours, period=IntervalSchedule.HOURS)
    task, _ = PeriodicTask.objects.get_or_create(name=SCHEDULE_NAME, defaults={"task": SCHEDULE_TASK, "interval": interval})
    return task


def reconciliation_schedule_ensure_after_migrate(**kwargs: Any) -> None:
    """post_migrate: ensure the schedule once the public schema (django-celery-beat's tables) is migrated."""
    if getattr(connection, "schema_name", None) == get_public_schema_name():
        reconciliation_schedule_ensure()
