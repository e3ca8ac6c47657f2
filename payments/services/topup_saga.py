"""The card top-up saga (SPEC 6, external effect; docs/ARCHITECTURE.md, "Card top-ups") on
the idempotency engine's external path, orchestrating the steps of topups.py, and its
recovery. 1. The claim commits the record, the pending top-up (id minted at claim time) and
its event. 2. `topup_saga_charge`, outside any transaction, charges the card under the
top-up's id; no answer is a 503 `psp_unavailable` (the record failed_retryable, the top-up
pending), for a retry, a webhook or the recovery to converge. 3./4. The returned settlement
runs in `idempotency_complete_produced`: one transaction locks the record, checks its fence,
credits (201) or fails (402) the top-up and stores the answer; a holder whose lease was
taken over writes nothing. 5. `topup_recovery_run`: card refunds, orphaned claims, pending
top-ups, then the purge of PSP event markers (docs/RELIABILITY.md, "A slow PSP"). The
request and the recovery store the same answer for one outcome (`topup_answer`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone
from rest_framework.fields import DateTimeField
from rest_framework.renderers import JSONRenderer

from idempotency.engine import (
    Executed,
    IdempotencyContext,
    IdempotentCall,
    StoredResponse,
    idempotency_complete_produced,
    idempotency_fail,
    idempotency_lease_takeover,
)
from idempotency.models import IdempotencyRecord, RecordState
from idempotency.selectors import idempotency_orphans_list, idempotency_record_get, idempotency_record_snapshot
from payments.errors import PspChargeMismatch, PspKeyWindowPassed, PspRefused
from payments.gateways import metrics
from payments.locks import topup_recovery_lock
from payments.models import TopUp, TopUpStatus
from payments.selectors import topup_get, topups_operator_review_count, topups_pending_count, topups_recoverable
from payments.services import psp_webhooks, refunds, topups
from payments.services.topup_budget import LoopBudget, recovery_pass_deadline, recovery_step_isolated, topups_in_turn
from payments.services.topup_due import topup_due_settle, topup_recovery_due_now
from wallets.errors import BusinessRefusal, NotFound, TallyError
from wallets.transactions import is_connection_failure, run_atomic

logger = logging.getLogger("tally.topups")
T = TypeVar("T")

MINT_NAME = "topup"

# Step 3/4, in the completion's transaction: the settled top-up and its refusal, if failed.
Settle = Callable[[], tuple[TopUp, BusinessRefusal | None]]


def topup_answer(*, topup: TopUp, refusal: BusinessRefusal | None, request_id: str) -> StoredResponse:
    """The answer a settled top-up's key stores and replays, in the API's bytes: 201 with the
    top-up (as the customer face's `TopUpOut`), or 402 with the SPEC 5 error envelope of the
    refusal (apikit.errors); a test holds it to the faces' own rendering."""
    data: dict[str, Any]
    if refusal is None:
        status, data = 201, {
            "id": str(topup.id), "object": "topup", "created": DateTimeField().to_representation(topup.created),
            "status": str(topup.status), "customer": str(topup.customer_id), "asset": str(topup.asset_id), "amount": int(topup.amount),
            "bonus_amount": int(topup.bonus_amount), "payment_method": str(topup.payment_method), "failure_code": str(topup.failure_code),
        }
    else:
        status, data = 402, {"error": {
            "type": "payment_error", "code": str(refusal.code), "message": refusal.message, "param": refusal.param, "request_id": request_id,
        }}
    return StoredResponse(status=status, headers={"Content-Type": "application/json"}, body=JSONRenderer().render(data))


def topup_saga_charge(*, topup_id: str, first_attempt: bool = True) -> Settle:
    """Step 2 (no transaction open): refuse early or charge the card; returns step 3/4, for
    the fenced completion. Raises PspUnavailable when the PSP's answer is unknown. Only a
    first attempt refuses before charging: a retry cannot know whether the earlier charge
    went through, so it asks the PSP and lets the settlement refuse (and refund) the credit."""
    topup = topup_get(topup_id=topup_id)
    if topup.status != TopUpStatus.PENDING:  # settled already (a webhook, or an earlier attempt)
        return functools.partial(topups.topup_outcome, topup_id=topup_id)
    refusal = topups.topup_refusal_check(topup=topup) if first_attempt else None
    if refusal is not None:
        return functools.partial(topups.topup_refuse, topup_id=topup_id, refusal=refusal)
    settle = _charge_then(topup=topup)
    pause = float(getattr(settings, "TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS", 0.0))
    if pause > 0:  # tests only: a window to kill the process between the charge and the completion
        time.sleep(pause)
    return settle


def _charge_then(*, topup: TopUp) -> Settle:
    """Ask the PSP (same key, same parameters) and return the settlement that applies its
    answer; a request the PSP refused charged nothing: a 402 like a decline, not a 503."""
    try:
        result = topups.topup_charge(topup=topup)
    except PspRefused as refused:
        return functools.partial(topups.topup_refuse, topup_id=topup.pk, refusal=refused)
    if result.status == "succeeded" and not topups.topup_charge_matches(topup=topup, result=result):
        # Not this top-up's charge to credit: held for an operator (its own transaction,
        # which the completion could not give it: that one is rolled back by the refusal).
        topups.topup_charge_mismatch_hold(topup_id=topup.pk, result=result, source="the PSP's answer to our charge")
        raise PspChargeMismatch("the card processor's charge does not match this top-up: an operator settles it")
    return functools.partial(topups.topup_settle, topup_id=topup.pk, result=result)


RECOVERY_PAGE_SIZE = 100  # rows per page, not a cap: a run reads pages until none is left


def _call_of(record: IdempotencyRecord) -> IdempotentCall:
    return IdempotentCall(
        principal_id=record.principal_id, key=record.key, fingerprint=record.fingerprint, scope=record.scope,
        request_id=record.request_id, method=record.method, path=record.path,
    )


def _resolve(*, ctx: IdempotencyContext, call: IdempotentCall, topup_id: str) -> str:
    """Ask the PSP again with the same key and complete the record; if anything raises, the
    record is handed back (failed_retryable) first, so the client's retry does not wait."""
    try:
        return _resolve_taken(ctx=ctx, call=call, topup_id=topup_id)
    except Exception:
        try:
            idempotency_fail(record_id=ctx.record_id or 0, fence=ctx.fence)
        except DatabaseError:
            logger.warning("could not hand back a top-up's record after an error", extra={"topup": topup_id})
        raise


def _resolve_taken(*, ctx: IdempotencyContext, call: IdempotentCall, topup_id: str) -> str:
    try:
        topup = topup_get(topup_id=topup_id)
    except NotFound:  # the claim died before its top-up committed: nothing was charged
        return "unavailable"
    settle: Settle
    if topup.status == TopUpStatus.PENDING:
        try:
            settle = _charge_then(topup=topup)
        except (PspKeyWindowPassed, PspChargeMismatch):
            # Handed back (failed_retryable): the top-up waits for an operator, and the
            # record must not come round again as an orphan every lease.
            idempotency_fail(record_id=ctx.record_id or 0, fence=ctx.fence)
            return "operator_review"
        except TallyError as exc:
            topups.topup_last_error_note(topup_id=topup_id, error=exc.message)
            return "unavailable"  # still unknown: the lease runs out again and the next run retries
    else:
        settle = functools.partial(topups.topup_outcome, topup_id=topup_id)

    def produce() -> Executed:
        topup, refusal = settle()
        return Executed(response=topup_answer(topup=topup, refusal=refusal, request_id=call.request_id))

    produced = idempotency_complete_produced(ctx=ctx, call=call, produce=produce)
    if produced is None:
        return "superseded"
    return "succeeded" if produced.response.status < 300 else "failed"


def _orphan_resolve(record: IdempotencyRecord, topup_id: str, lease_seconds: int) -> str:
    ctx = idempotency_lease_takeover(principal_id=record.principal_id, key=record.key, lease_seconds=lease_seconds)
    if ctx is None:
        return ""  # taken meanwhile: someone else is at it
    return _resolve(ctx=ctx, call=_call_of(record), topup_id=topup_id)


def _pending_resolve(topup: TopUp, lease_seconds: int) -> str:
    snapshot = idempotency_record_snapshot(principal_id=topup.claim_principal_id, key=topup.claim_key)
    if snapshot is None or snapshot.minted.get(MINT_NAME) != topup.pk:
        return _settle_without_record(topup)
    if snapshot.state == RecordState.COMPLETED:
        # The key's answer is final and the top-up still pending: nothing may change that
        # answer, so a person has to look.
        held = topups.topup_review_hold(topup_id=topup.pk, reason="its request's answer is stored while the top-up is still pending")
        return "operator_review" if held else ""
    ctx = idempotency_lease_takeover(
        principal_id=topup.claim_principal_id, key=topup.claim_key, lease_seconds=lease_seconds, include_failed=True
    )
    if ctx is None:
        return ""  # a live lease: its holder is still at work
    taken = idempotency_record_get(principal_id=topup.claim_principal_id, key=topup.claim_key)
    if taken is None:
        return ""
    return _resolve(ctx=ctx, call=_call_of(taken), topup_id=topup.pk)


def topup_recovery_run(*, batch_size: int = RECOVERY_PAGE_SIZE, pass_deadline: float | None = None) -> dict[str, int]:
    """One tenant's recovery pass (step 5; loops and budgets: topup_budget.py), its loops cut
    to `pass_deadline` (`time.monotonic()`; None: a pass starting now; the recovery task
    passes the deadline its payout pass already spent from). Returns counts by outcome, or
    {"skipped": 1} while another pass of the tenant runs. A loop cut short by its budget
    (`budget_exhausted`) leaves the tenant due now for the next pass.
    Locks: the tenant's recovery lock (session advisory); per item, the idempotency record
    (takeover, fenced completion), the top-up row and the balance rows; then the due-work
    lock, tried (`topup_due_settle`), and, with work left, SHARED (`topup_recovery_due_now`)."""
    with topup_recovery_lock() as taken:
        if not taken:
            return {"skipped": 1}
        counts = _recovery_pass(batch_size=batch_size, pass_deadline=recovery_pass_deadline() if pass_deadline is None else pass_deadline)
        topup_due_settle()
        if counts.get("budget_exhausted"):
            # After the settle (which reads only what the records make due): a row due now
            # only if the settle left none; due_work_mark never moves one it wrote.
            topup_recovery_due_now()
        return counts


def _recovery_pass(*, batch_size: int, pass_deadline: float) -> dict[str, int]:
    lease_seconds = int(settings.TALLY_TOPUP_LEASE_SECONDS)
    counts: dict[str, int] = {}

    def count(outcome: str) -> None:
        if not outcome:
            return
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome != "superseded":
            metrics.TOPUP_ORPHANS_RECOVERED.labels(outcome=outcome).inc()

    def step(name: str, fn: Callable[[], T], default: T) -> T:
        try:
            return fn()
        except SoftTimeLimitExceeded:
            raise  # the task's time is up: the pass ends here, not one step of it
        except Exception as exc:
            if isinstance(exc, DatabaseError) and is_connection_failure(exc):
                raise
            logger.exception("a top-up recovery step failed; the run goes on", extra={"step": name})
            metrics.TOPUP_RECOVERY_STEP_ERRORS.labels(step=name).inc()
            counts["step_errors"] = counts.get("step_errors", 0) + 1
            return default

    budgets: list[LoopBudget] = []

    def budget() -> LoopBudget:
        budgets.append(LoopBudget.from_settings(pass_deadline=pass_deadline))
        return budgets[-1]

    # Refunds first: a card charged and never credited is money we hold; a backlog of
    # top-ups to ask about must never keep it waiting for the hard time limit.
    nothing: dict[str, int] = {}
    refunds_budget = budget()
    counts.update(step("refunds", lambda: refunds.topup_refunds_run(batch_size=batch_size, budget=refunds_budget), nothing))

    seen: set[str] = set()
    orphans_budget = budget()
    after_record: tuple[datetime, int] | None = None
    started = timezone.now()
    while not orphans_budget.exhausted:
        records = idempotency_orphans_list(limit=batch_size, after=after_record, expired_by=started)
        for record in records:
            topup_id = str((record.minted or {}).get(MINT_NAME) or "")
            if record.effect != "external" or not topup_id or topup_id in seen:
                continue
            if orphans_budget.spent():
                break  # the records taken over got new leases: the next pass starts with the rest
            seen.add(topup_id)
            resolve = functools.partial(_orphan_resolve, record, topup_id, lease_seconds)
            count(recovery_step_isolated(step="resolve", topup_id=topup_id, fn=resolve))
        if len(records) < batch_size:
            break
        last = records[-1]
        assert last.lease_expires_at is not None
        after_record = (last.lease_expires_at, last.pk)

    stale = topups_recoverable(created_before=timezone.now() - timedelta(seconds=lease_seconds))
    for topup in topups_in_turn(loop="pending", topups=stale, batch_size=batch_size, budget=budget()):
        if topup.pk not in seen:
            resolve = functools.partial(_pending_resolve, topup, lease_seconds)
            count(recovery_step_isolated(step="resolve", topup_id=topup.pk, fn=resolve))

    counts["webhook_markers_purged"] = step("purge", psp_webhooks.psp_webhook_events_purge, 0)
    step("gauges", topups_gauges_refresh, nothing)
    exhausted = sum(1 for b in budgets if b.exhausted)
    if exhausted:
        counts["budget_exhausted"] = exhausted
        logger.warning("top-up recovery pass cut short by its time budget: the next pass goes on", extra={"loops": exhausted})
    return counts


def _settle_without_record(topup: TopUp) -> str:
    """A pending top-up whose record was purged: settle the top-up alone."""
    try:
        settle = _charge_then(topup=topup)
    except (PspKeyWindowPassed, PspChargeMismatch):
        return "operator_review"
    except TallyError as exc:
        topups.topup_last_error_note(topup_id=topup.pk, error=exc.message)
        return "unavailable"
    _, refusal = run_atomic(settle, operation="topup_recover")
    return "succeeded" if refusal is None else "failed"


def topups_gauges_refresh() -> dict[str, int]:
    """The pending and operator-queue gauges of the current tenant."""
    tenant = str(getattr(connection, "schema_name", "public"))
    pending, review = topups_pending_count(), topups_operator_review_count()
    metrics.TOPUPS_PENDING.labels(tenant=tenant).set(pending)
    metrics.TOPUPS_OPERATOR_REVIEW.labels(tenant=tenant).set(review)
    return {"pending": pending, "operator_review": review}
