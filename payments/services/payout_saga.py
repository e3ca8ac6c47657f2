"""The payout saga, built like card top-ups (topup_saga.py), with the lease and fence on the
payout's own row: a payout is made (payouts.py: the merchant's money moved to payouts in
transit, in one transaction with its row and `payout.created`), then sent to the PSP under
its id as the idempotency key, outside any transaction:

1. `_lease_take`: one short transaction locks the pending payout, bumps its `fence`, sets a
   lease and counts the attempt (from then on the PSP may have it: it cannot be canceled);
2. the PSP call, no lock held;
3. `_complete`: locks the row again and applies the answer only if its fence is still the
   one taken in 1 (a holder whose lease ran out and was taken over writes nothing);
4. the answer, a PSP webhook (psp_webhooks.py) or the recovery's question to the PSP apply
   the same way (`payout_settle`): in transit; paid (in transit -> PSP settlement); failed.
   Failed with nothing sent (refused at once) moves the money back to the merchant there.
   A payout the PSP had and then failed or canceled (even after paid) is first owed back
   (`return_owed_at`): `payout_return` asks the gateway to take back what it sent on (at
   Stripe, the transfer to the connected account, key `<payout id>:reversal:<transfer>`), no
   transaction open, and only then moves the money back to the merchant (from in transit,
   or from the PSP settlement for a paid one). Each moves money once: the status is checked
   on the locked row, and the database refuses a status that goes back (migration 0026);
5. `payout_recovery_run` (beat, with the top-up recovery, as one loop of its time budget:
   payments.tasks): sends what was never sent or whose
   holder died (same key: the PSP answers its first payout), retries the returns the PSP
   did not answer, and asks the PSP about payouts in transit past its promise, whose webhook
   may be lost.

What the saga cannot settle by the PSP's word stops for an operator (`payout_review_stop`,
the queue of payouts.py): the PSP's payout of another amount, currency or id than ours, a
return the PSP refuses (also right after refusing the payout itself: GatewayReturnRefused),
the PSP saying sent of a payout whose money is back with the merchant. Nothing moves a
payout in the queue but two staff members, and a failure they confirm of a payout the PSP
may have goes through `payout_return` too: the money comes back to the merchant only once
the PSP has given it back.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from payments.gateways import metrics
from payments.gateways.base import GatewayError, GatewayRejected, GatewayReturnRefused, PayoutRequest, PayoutResult
from payments.gateways.registry import gateway_build
from payments.locks import payout_lock, payout_recovery_lock
from payments.models import Payout, PayoutStatus
from payments.selectors import gateway_account_get, payout_queues, payouts_returns_owed, payouts_sendable, payouts_to_check
from payments.services.outbox import epoch_seconds, outbox_event_create
from payments.services.topup_budget import LoopBudget, recovery_pass_deadline
from payments.services.topups import PSP_KEY_TRUSTED_FOR
from tenants.duework import due_work_mark
from tenants.models import DueWorkKind
from wallets.errors import NotFound, TallyError
from wallets.locks import merchant_share_lock
from wallets.models import Account, LedgerTransaction, LedgerTransactionKind, StaffMember, SystemRole
from wallets.selectors import movement_accounts_get
from wallets.services.audit import audit_record
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service, is_connection_failure

logger = logging.getLogger("tally.payouts")

# The failure code of a payout two staff members failed (`return_failure_code` until its money is back).
OPERATOR_FAILED = "operator_failed"

SUBMIT_TASK_NAME = "payments.payout_submit"
RETURN_TASK_NAME = "payments.payout_return"
RECOVERY_PAGE_SIZE = 100


def payout_event_create(*, payout: Payout, topic: str) -> None:
    """The payout's event (`payout.created`, `.paid`, `.failed`, `.canceled`) with its state,
    in the caller's transaction. Needs: the payout row locked, or new."""
    arrival = payout.arrival_expected_at
    outbox_event_create(
        topic=topic, sequence=1 if topic == "payout.created" else None,
        payload={
            "id": payout.pk, "object": "payout", "merchant": payout.merchant_id, "asset": payout.asset_id, "amount": payout.amount,
            "status": payout.status, "origin": payout.origin, "failure_code": payout.failure_code,
            "arrival_date": epoch_seconds(arrival) if arrival else None, "created": epoch_seconds(payout.created),
        },
    )


def payout_due_mark(*, at: timedelta = timedelta(0)) -> None:
    """In the caller's transaction: the recovery (the top-up recovery's due-work row, which
    covers both sagas) has a look `at` from now. Locks: that due-work lock, SHARED."""
    due_work_mark(kind=DueWorkKind.TOPUPS, due_at=timezone.now() + at)


def _lease() -> timedelta:
    return timedelta(seconds=int(settings.TALLY_PAYOUT_LEASE_SECONDS))


def payout_submit_on_commit(*, payout_id: str) -> None:
    """Send the payout to the PSP from a worker once this transaction commits. A lost send
    is the recovery's: the payout's due-work row is written with it."""
    _task_on_commit(SUBMIT_TASK_NAME, payout_submit, payout_id=payout_id)


def payout_return_on_commit(*, payout_id: str) -> None:
    """Take back a failed payout's money at the PSP, then give it to the merchant
    (`payout_return`), from a worker once this transaction commits. A lost one is the
    recovery's: the transaction that owed it marked the due-work row."""
    _task_on_commit(RETURN_TASK_NAME, payout_return, payout_id=payout_id)


def _task_on_commit(name: str, work: Callable[..., str], *, payout_id: str) -> None:
    schema = str(getattr(connection, "schema_name", "public"))

    def send() -> None:
        try:
            if current_app.conf.task_always_eager:  # send_task ignores eager mode: do the task's work here
                work(payout_id=payout_id)
                return
            current_app.send_task(name, kwargs={"payout_id": payout_id}, headers={"_schema_name": schema}, retry=False, ignore_result=True)
        except Exception:  # the payout committed; the recovery does it
            logger.warning("payout task could not be queued; the recovery does it", extra={"payout": payout_id, "task": name}, exc_info=True)

    transaction.on_commit(send, robust=True)


# --- 1-3: one attempt -------------------------------------------------------------------------


@atomic_service(operation="payout_lease")
def _lease_take(*, payout_id: str) -> tuple[Payout, int] | None:
    """Step 1: the payout and its new fence, or None when it is not to be sent now (settled,
    awaiting approval, in the operator queue, owed back, held, frozen, or leased by a live
    holder). Locks: the payout row; the merchant row, FOR SHARE; then the due-work lock, SHARED."""
    payout = payout_lock(payout_id=payout_id)
    now = timezone.now()
    if payout is None or payout.status != PayoutStatus.PENDING or (payout.approval_required and payout.approved_at is None):
        return None
    if payout.review_at is not None or payout.return_owed_at is not None:
        return None
    if payout.lease_expires_at is not None and payout.lease_expires_at > now:
        return None
    # The hold as committed now: a hold being written waits for this lock, or this for it,
    # so a hold that committed first is seen here, and one that comes later finds the attempt counted.
    merchant = merchant_share_lock(merchant_id=payout.merchant_id)
    if merchant.payouts_held or Account.objects.filter(merchant_id=merchant.pk, frozen=True).exists():
        return None
    payout.fence += 1
    payout.attempts += 1
    payout.lease_expires_at = now + _lease()
    payout.save(update_fields=["fence", "attempts", "lease_expires_at", "updated"])
    payout_due_mark(at=_lease())  # if this holder dies, the recovery takes over at the lease's end
    return payout, payout.fence


def _psp_answer(payout: Payout) -> PayoutResult:
    """Step 2, no transaction open: the PSP's payout under our id. Past the PSP's key window
    it is looked up first (asking again could make a second one). Raises GatewayError when
    the outcome is unknown, NotFound when the gateway is no longer configured."""
    gateway = gateway_build(account=gateway_account_get(gateway=payout.gateway))
    if payout.attempts > 1 and timezone.now() - payout.created > PSP_KEY_TRUSTED_FOR:
        found = gateway.payouts_of(reference=payout.pk, destination=payout.destination, psp_reference=payout.psp_reference,
                                   since=payout.created)
        if found:
            return found[0]
    request = PayoutRequest(
        amount=payout.amount, currency=payout.asset_id, destination=payout.destination, idempotency_key=payout.pk, reference=payout.pk
    )
    try:
        return gateway.payout_create(request)
    except GatewayRejected as exc:  # the PSP refused the request itself: nothing was sent
        logger.warning("psp refused a payout request: nothing sent", extra={"payout": payout.pk, "psp_code": exc.code, "param": exc.param})
        return PayoutResult(status="failed", psp_reference="", amount=payout.amount, currency=payout.asset_id,
                            failure_code=f"psp_refused:{exc.code}" if exc.code else "psp_refused")


def payout_submit(*, payout_id: str) -> str:
    """Send one payout to the PSP and apply its answer (steps 1-3): returns in_transit, paid,
    failed, unavailable (the answer unknown: the lease runs out, the recovery asks again),
    superseded (taken over meanwhile), skipped (not to be sent now), review (stopped for an
    operator), or, for a payout the PSP made and failed, what `payout_return` returns.
    Locks: as `_lease_take`, then, no lock held for the PSP call, as `_complete`, then as
    `payout_return`."""
    lease = _lease_take(payout_id=payout_id)
    if lease is None:
        return "skipped"
    payout, fence = lease
    try:
        result = _psp_answer(payout)
    except GatewayReturnRefused as exc:
        return _refused_half_sent(payout_id=payout_id, fence=fence, error=exc)
    except (GatewayError, NotFound, TallyError) as exc:
        _error_note(payout_id=payout_id, error=str(exc))
        return "unavailable"
    pause = float(getattr(settings, "TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS", 0.0))
    if pause > 0:  # tests only: a window to kill the process between the PSP's answer and the completion
        time.sleep(pause)
    outcome = _complete(payout_id=payout_id, fence=fence, result=result)
    return payout_return(payout_id=payout_id) if outcome == "returning" else outcome


@atomic_service(operation="payout_complete")
def _complete(*, payout_id: str, fence: int, result: PayoutResult) -> str:
    """Step 3: apply the PSP's answer if `fence` is still the payout's. Locks: as `payout_settle`."""
    payout = payout_lock(payout_id=payout_id)
    if payout is None or payout.fence != fence:
        return "superseded"
    payout.lease_expires_at = None
    return _apply(payout, result, source="the PSP's answer")


@atomic_service(operation="payout_complete")
def _refused_half_sent(*, payout_id: str, fence: int, error: GatewayReturnRefused) -> str:
    """The PSP refused the payout after part of it had gone (a Connect transfer), then refused
    to take that back: the money sits at the PSP, so nothing goes back to the merchant on its
    own; the payout stops for an operator, the PSP's code kept for its failure. Locks: the
    payout row."""
    payout = payout_lock(payout_id=payout_id)
    if payout is None or payout.fence != fence:
        return "superseded"
    logger.error("psp refused a payout and the return of what it had sent on", extra={"payout": payout_id, "error": str(error)})
    payout.return_failure_code = (error.failure_code or "psp_refused")[:50]
    payout.save(update_fields=["return_failure_code", "updated"])
    return payout_review_stop_locked(payout, reason=f"{error}: the money is at the PSP, neither sent nor back")


def _error_note(*, payout_id: str, error: str) -> None:
    """What the last attempt ran into, for the operator. Locks: the payout row (one UPDATE)."""
    Payout.objects.filter(pk=payout_id).update(last_error=error[:500])


# --- 4: applying what the PSP says -------------------------------------------------------------


@atomic_service(operation="payout_settle")
def payout_settle(*, payout_id: str, result: PayoutResult, source: str) -> str:
    """Apply what the PSP says of a payout (a webhook, the recovery's question), whatever the
    fence. Locks: the payout row, then the balance rows (ledger_post)."""
    payout = payout_lock(payout_id=payout_id)
    if payout is None:
        raise NotFound("no such payout", param="payout")
    return _apply(payout, result, source=source)


def _apply(payout: Payout, result: PayoutResult, *, source: str) -> str:
    """Move the locked payout on by the PSP's word; never back (a late in_transit after paid
    changes nothing). A payout in the operator queue moves no more (`in_review`: the word is
    noted for the person, and a resolution proposed before it is void: proposed again on the
    facts as they are now). The PSP's payout of another amount, currency or id than ours moves
    nothing and stops the payout for an operator, as does the PSP saying sent (in transit,
    paid) of a payout failed or canceled here, whose money is back with the merchant (unless
    the PSP had failed that very payout: then the word is an old one). A failure of a payout
    the PSP had owes its money back (`payout_return`, the caller's next step): returns
    `returning`."""
    heard = f"the PSP says {result.status} of {result.psp_reference or 'no payout'} ({source})"
    if payout.review_at is not None:
        payout.last_error = f"in the operator queue; {heard}"[:500]
        fields = ["last_error", "lease_expires_at", "updated"]
        if payout.review_maker_id is not None:
            # Proposed on what was known before this word: it is proposed again, on the facts as they are now.
            audit_record(action="payout.review_proposal_void", target_type="payout", target_id=payout.pk, reason=heard[:500],
                         before={"review_outcome": payout.review_outcome, "review_maker": payout.review_maker_id},
                         after={"review_outcome": "", "review_maker": None})
            payout.review_maker, payout.review_outcome = None, ""
            fields += ["review_maker", "review_outcome"]
        payout.save(update_fields=fields)
        return "in_review"
    sent = bool(result.psp_reference)
    if payout.status in (PayoutStatus.FAILED, PayoutStatus.CANCELED):
        # Its money is back with the merchant: nothing the PSP says moves it again.
        if result.status == "failed" or not sent:
            return "unchanged"
        if result.psp_reference == payout.psp_reference and payout.return_failure_code not in ("", OPERATOR_FAILED):
            # The PSP itself failed this very payout, and its payouts never come back from failed:
            # this word is older than that one (webhooks come in any order).
            logger.warning("psp word older than the payout's failure: nothing applied", extra={"payout": payout.pk, "source": source})
            return "unchanged"
        # The PSP sent money whose payout gave it back to the merchant here: paid twice, a person looks.
        return payout_review_stop_locked(payout, reason=f"{heard}, but this payout is {payout.status}: its money is back with the merchant")
    if sent and payout.psp_reference and result.psp_reference != payout.psp_reference:
        return payout_review_stop_locked(
            payout, reason=f"the PSP's payout {result.psp_reference} is not ours ({payout.psp_reference}): {result.status} ({source})"
        )
    if sent and (result.amount != payout.amount or result.currency.upper() != payout.asset_id.upper()):
        logger.error("psp payout does not match ours: nothing applied", extra={
            "payout": payout.pk, "psp_reference": result.psp_reference, "psp_amount": result.amount, "source": source})
        return payout_review_stop_locked(
            payout, reason=f"the PSP's payout {result.psp_reference} is {result.amount} {result.currency}, not ours ({source})",
        )
    if sent and not payout.psp_reference:
        payout.psp_reference, payout.psp_created_at = result.psp_reference[:200], result.created
    if result.arrival is not None:
        payout.arrival_expected_at = result.arrival
    fields = ["psp_reference", "psp_created_at", "arrival_expected_at", "lease_expires_at", "updated"]
    outcome = str(result.status)
    if result.status == "in_transit" and payout.status == PayoutStatus.PENDING:
        payout.status = PayoutStatus.IN_TRANSIT
        fields.append("status")
    elif result.status == "paid" and payout.status in (PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT):
        payout.paid_transaction = _move(payout, kind=LedgerTransactionKind.PAYOUT_PAID, to_psp=True)
        payout.status, payout.settled_at = PayoutStatus.PAID, timezone.now()
        fields += ["status", "paid_transaction", "settled_at"]
    elif result.status == "failed" and payout.status in (PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT, PayoutStatus.PAID) and sent:
        # The PSP had it: what it sent on (a Connect transfer) comes back before the merchant's money does.
        if payout.return_owed_at is None:
            payout.return_owed_at, payout.return_failure_code = timezone.now(), (result.failure_code or "failed")[:50]
            fields += ["return_owed_at", "return_failure_code"]
            payout_due_mark()  # the recovery's, if the return is not done at once
        outcome = "returning"
    elif result.status == "failed" and payout.status in (PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT):
        # Refused at once, nothing sent (nor left at the PSP: an adapter takes back what it sent first).
        payout.returned_transaction = _move(payout, kind=LedgerTransactionKind.PAYOUT_BACK)
        payout.status, payout.settled_at, payout.failure_code = PayoutStatus.FAILED, timezone.now(), (result.failure_code or "failed")[:50]
        fields += ["status", "returned_transaction", "settled_at", "failure_code"]
    else:
        outcome = "unchanged"
    payout.save(update_fields=fields)
    if outcome in ("paid", "failed"):
        payout_event_create(payout=payout, topic=f"payout.{outcome}")
    return outcome


def payout_review_stop_locked(payout: Payout, *, reason: str, staff: StaffMember | None = None) -> str:
    """Stop the locked payout for an operator (the queue of payouts.py), audited: the saga
    moves it no more (its fence moves on, so a send in flight cannot complete; the recovery
    skips it) until two staff members resolve it. Returns `review`. Needs: the payout row
    locked. Locks: none more."""
    payout.review_at, payout.review_reason, payout.review_outcome, payout.review_maker = timezone.now(), reason[:500], "", None
    # An earlier resolution's confirmer is no one's checker on this stop: anyone may propose anew.
    payout.review_resolved_by, payout.review_resolved_at = None, None
    payout.fence += 1
    payout.lease_expires_at, payout.last_error = None, reason[:500]
    payout.save(update_fields=["review_at", "review_reason", "review_outcome", "review_maker", "review_resolved_by", "review_resolved_at",
                               "fence", "lease_expires_at", "last_error", "updated"])
    audit_record(action="payout.review_stop", target_type="payout", target_id=payout.pk, reason=reason[:500],
                 after={"status": payout.status, "return_owed": payout.return_owed_at is not None},
                 actor=f"user:{staff.user.get_username()}" if staff is not None and staff.user_id else None)
    logger.error("payout stopped for an operator", extra={"payout": payout.pk, "reason": reason[:500]})
    return "review"


def _move(payout: Payout, *, kind: str, to_psp: bool = False, from_psp: bool = False) -> LedgerTransaction:
    """The payout's second ledger transaction: in transit -> PSP settlement (paid), in
    transit -> merchant (failed, canceled), or PSP settlement -> merchant (returned after
    paid). A frozen merchant gets its money back all the same. Needs: the payout row locked.
    Locks: then the balance rows (ledger_post)."""
    accounts = movement_accounts_get(customer_id=None, merchant_id=payout.merchant_id,
                                     system_roles=(SystemRole.PAYOUTS_IN_TRANSIT, SystemRole.PSP_FUNDING))
    in_transit, psp = accounts.system_account(SystemRole.PAYOUTS_IN_TRANSIT), accounts.system_account(SystemRole.PSP_FUNDING)
    source = psp if from_psp else in_transit
    target = psp if to_psp else accounts.merchant
    assert target is not None
    legs = [Leg(source, payout.asset_id, -payout.amount), Leg(target, payout.asset_id, payout.amount)]
    return ledger_post(kind=kind, reference=payout.pk, legs=legs, allow_frozen=True)


def payout_funds_return(*, payout: Payout, status: str, failure_code: str) -> Payout:
    """A pending payout the PSP never had ends `canceled` (or `failed` with `failure_code`),
    its money back with the merchant. Needs: the payout row locked. Locks: the balance rows."""
    payout.returned_transaction = _move(payout, kind=LedgerTransactionKind.PAYOUT_BACK)
    payout.status, payout.settled_at, payout.failure_code, payout.lease_expires_at = status, timezone.now(), failure_code[:50], None
    payout.save(update_fields=["returned_transaction", "status", "settled_at", "failure_code", "lease_expires_at", "updated"])
    payout_event_create(payout=payout, topic=f"payout.{status}")
    return payout


# --- 4b: a failed payout's money, back through the PSP ---------------------------------------


def payout_return(*, payout_id: str) -> str:
    """The money of a payout the PSP had and then failed or canceled (or two staff members
    failed) goes back to the merchant only once the gateway has taken back what it sent on
    (at Stripe, the transfer to the merchant's connected account: key
    `<payout id>:reversal:<transfer id>`), asked with no transaction open. Returns failed (the money is back with the merchant), return_unavailable
    (no answer: the payout stays owed, the recovery asks again), review (the PSP refused:
    stopped for an operator, the money stays where it is), unchanged (nothing owed now).
    Locks: the payout row (one UPDATE); then as `_returned` or `_return_refused`."""
    payout = Payout.objects.filter(pk=payout_id).first()
    if payout is None or payout.return_owed_at is None or payout.review_at is not None:
        return "unchanged"
    Payout.objects.filter(pk=payout_id).update(psp_checked_at=timezone.now())  # the recovery's next try waits a lease
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=payout.gateway))
        gateway.payout_return(reference=payout.pk, psp_reference=payout.psp_reference, destination=payout.destination,
                              idempotency_key=f"{payout.pk}:reversal")
    except GatewayRejected as exc:
        return _return_refused(payout_id=payout_id, error=str(exc))
    except (GatewayError, NotFound, TallyError) as exc:
        _error_note(payout_id=payout_id, error=f"taking back the failed payout's money: {exc}")
        return "return_unavailable"
    return _returned(payout_id=payout_id)


@atomic_service(operation="payout_return")
def _returned(*, payout_id: str) -> str:
    """The PSP took the money back: it goes back to the merchant, once. Locks: the payout
    row, then the balance rows (ledger_post)."""
    payout = payout_lock(payout_id=payout_id)
    if payout is None or payout.return_owed_at is None or payout.review_at is not None:
        return "unchanged"
    payout_funds_back(payout=payout, failure_code=payout.return_failure_code or "failed")
    return "failed"


@atomic_service(operation="payout_return_refused")
def _return_refused(*, payout_id: str, error: str) -> str:
    """The PSP refused to take the money back: nothing goes back to the merchant on its own.
    Locks: the payout row."""
    payout = payout_lock(payout_id=payout_id)
    if payout is None or payout.return_owed_at is None or payout.review_at is not None:
        return "unchanged"
    return payout_review_stop_locked(payout, reason=f"the PSP refused to take back the money of its failed payout"
                                                    f" {payout.psp_reference}: {error}")


def payout_paid_move(*, payout: Payout) -> Payout:
    """A pending or in-transit payout ends `paid`: in transit -> the PSP settlement account.
    Needs: the payout row locked. Locks: the balance rows."""
    payout.paid_transaction = _move(payout, kind=LedgerTransactionKind.PAYOUT_PAID, to_psp=True)
    payout.status, payout.settled_at, payout.lease_expires_at = PayoutStatus.PAID, timezone.now(), None
    payout.save(update_fields=["paid_transaction", "status", "settled_at", "lease_expires_at", "updated"])
    payout_event_create(payout=payout, topic="payout.paid")
    return payout


def payout_funds_back(*, payout: Payout, failure_code: str) -> Payout:
    """A payout ends `failed` with its money back with the merchant, from in transit, or
    from the PSP settlement account when it had been paid; no return is owed any more.
    Needs: the payout row locked. Locks: the balance rows."""
    payout.returned_transaction = _move(payout, kind=LedgerTransactionKind.PAYOUT_BACK, from_psp=payout.status == PayoutStatus.PAID)
    payout.status, payout.settled_at, payout.failure_code = PayoutStatus.FAILED, timezone.now(), failure_code[:50]
    payout.return_owed_at, payout.lease_expires_at = None, None
    payout.save(update_fields=["returned_transaction", "status", "settled_at", "failure_code", "return_owed_at", "lease_expires_at", "updated"])
    payout_event_create(payout=payout, topic="payout.failed")
    return payout


# --- 5: recovery ------------------------------------------------------------------------------


def payout_recovery_run(*, batch_size: int = RECOVERY_PAGE_SIZE, budget: LoopBudget | None = None) -> dict[str, int]:
    """One tenant's payout recovery pass: send the pending payouts whose send was lost or
    whose holder died, take back the money of failed payouts the PSP did not answer about
    (`return_*` counts), then ask the PSP about payouts in transit past its promise, while
    `budget` lasts (the recovery task's loop share, cut to its pass's deadline; None: such a
    share of a pass starting now); the payout in hand is finished. Cut short, it counts
    `budget_exhausted`: what it left is still due (the top-up pass's settle of the due-work
    row both share reads it). Payouts in the operator queue are left alone; last, the payout
    gauges (`payouts_gauges_refresh`). Returns counts by outcome, or {"skipped": 1} while
    another pass runs. Locks: the tenant's payout recovery lock (session advisory); per
    payout, as `payout_submit`, `payout_return` or `payout_settle`."""
    with payout_recovery_lock() as taken:
        if not taken:
            return {"skipped": 1}
        if budget is None:
            budget = LoopBudget.from_settings(pass_deadline=recovery_pass_deadline())
        counts: dict[str, int] = {}
        now = timezone.now()
        seen: set[str] = set()
        while not budget.spent():
            page = [p for p in payouts_sendable(created_before=now - _lease(), now=now).values_list("pk", flat=True)[:batch_size]
                    if p not in seen]
            for payout_id in page:
                if budget.spent():
                    break
                seen.add(payout_id)
                _count(counts, _isolated(functools.partial(payout_submit, payout_id=payout_id), payout_id))
            if len(page) < batch_size:
                break
        for payout_id in payouts_returns_owed(now=now, retry_after=_lease()).values_list("pk", flat=True)[:batch_size]:
            if budget.spent():
                break
            returned = _isolated(functools.partial(payout_return, payout_id=payout_id), payout_id)
            _count(counts, returned if returned.startswith("return_") else f"return_{returned}")
        check_every = timedelta(seconds=int(settings.TALLY_PAYOUT_CHECK_SECONDS))
        if not budget.exhausted:
            for payout in payouts_to_check(now=now, check_every=check_every)[:batch_size]:
                if budget.spent():
                    break
                _count(counts, "checked_" + _isolated(functools.partial(_check, payout), payout.pk))
        if budget.exhausted:
            counts["budget_exhausted"] = 1
            logger.warning("payout recovery pass cut short by its time budget: the next pass goes on")
        try:
            payouts_gauges_refresh()
        except DatabaseError as exc:
            if is_connection_failure(exc):
                raise
            logger.exception("the payout gauges could not be refreshed; the pass goes on")
        return counts


def payouts_gauges_refresh() -> dict[str, int]:
    """The current tenant's gauges of payouts waiting for a person (the operator queue) or for
    the PSP (money owed back), with the age of the oldest of each: an alert's threshold."""
    tenant = str(getattr(connection, "schema_name", "public"))
    queues = payout_queues()
    now = timezone.now()
    metrics.PAYOUTS_OPERATOR_REVIEW.labels(tenant=tenant).set(queues.operator_review)
    metrics.PAYOUTS_RETURNS_OWED.labels(tenant=tenant).set(queues.returns_owed)
    for queue, oldest in (("operator_review", queues.operator_review_oldest), ("return_owed", queues.returns_owed_oldest)):
        metrics.PAYOUTS_WAITING_OLDEST.labels(tenant=tenant, queue=queue).set(max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
    return {"operator_review": queues.operator_review, "returns_owed": queues.returns_owed}


def _check(payout: Payout) -> str:
    """Ask the PSP what became of an in-transit payout and apply it."""
    Payout.objects.filter(pk=payout.pk).update(psp_checked_at=timezone.now())
    gateway = gateway_build(account=gateway_account_get(gateway=payout.gateway))
    found = gateway.payouts_of(reference=payout.pk, destination=payout.destination, psp_reference=payout.psp_reference, since=payout.created)
    if not found:
        return "unknown"
    # Another PSP payout under our id than the one we hold is settled as a mismatch: a person looks.
    ours = [r for r in found if r.psp_reference == payout.psp_reference] or found
    outcome = payout_settle(payout_id=payout.pk, result=ours[0], source="the recovery's question")
    return payout_return(payout_id=payout.pk) if outcome == "returning" else outcome


def _isolated(fn: Callable[[], str], payout_id: str) -> str:
    """One payout's step: an error is logged and counted, the pass goes on."""
    try:
        return fn()
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:
        if isinstance(exc, DatabaseError) and is_connection_failure(exc):
            raise
        logger.exception("a payout recovery step failed; the pass goes on", extra={"payout": payout_id})
        return "error"


def _count(counts: dict[str, int], outcome: str) -> None:
    counts[outcome] = counts.get(outcome, 0) + 1

