"""Payouts: a merchant's available funds to its bank account at the PSP. Making one (the
merchant's request, the schedule, a staff retry) moves the amount from the merchant to
payouts in transit in one transaction with the payout row and its `payout.created`; the
PSP is then asked by the saga (payout_saga.py). Here too: the bank account, the controls
(approval, hold and release, cancel, retry), the operator queue (stop, resolve) and the
scheduled run."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta

from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from payments.errors import (
    ApproverIsMaker,
    AssetNotPayable,
    BankAccountMissing,
    InsufficientAvailable,
    PayoutNotCancelable,
    PayoutsHeld,
    PspUnavailable,
)
from payments.gateways.base import GatewayError, GatewayRejected
from payments.gateways.registry import gateway_build
from payments.locks import payout_lock, payout_schedule_lock
from payments.models import MerchantBankAccount, Payout, PayoutOrigin, PayoutStatus, new_payout_id
from payments.selectors import bank_account_of, gateway_account_active, gateway_account_get
from payments.services.approvals import staff_solo_posting_decide
from payments.services.payout_saga import (
    OPERATOR_FAILED,
    payout_due_mark,
    payout_event_create,
    payout_funds_back,
    payout_funds_return,
    payout_paid_move,
    payout_return_on_commit,
    payout_review_stop_locked,
    payout_submit,
    payout_submit_on_commit,
)
from wallets.errors import InvalidRequest, InvalidState, NotFound, WalletFrozen
from wallets.locks import ALL_SHARDS, BalanceWant, LockedBalances, balance_rows_lock, connection_shard, merchant_lock
from wallets.models import Account, Asset, LedgerTransactionKind, Merchant, PayoutSchedule, StaffMember, SystemRole
from wallets.money import amount_to_minor
from wallets.selectors import asset_get, merchant_funds_split, merchant_settlement_delay_days, movement_accounts_get
from wallets.services.audit import audit_record
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service, run_atomic

logger = logging.getLogger("tally.payouts")

# A payout to a bank account changed this recently waits for a staff member's approval.
BANK_ACCOUNT_COOLING = timedelta(days=7)


def _available(*, locked: LockedBalances, account: Account, asset_code: str, delay_days: int, now: datetime) -> int:
    """What the merchant may be paid out now, read on its locked rows (every shard): their
    sums split by wallets.selectors.merchant_funds_split, the one split GET
    /v1/merchant/balance shows, so a payout never refuses what the balance says is available
    (nor allows what it says is pending)."""
    shards = locked.shards(account=account, asset_code=asset_code)
    sums = {asset_code: (sum(row.balance for row in shards), sum(row.held for row in shards))}
    [funds] = merchant_funds_split(account_id=account.pk, delay_days=delay_days, sums=sums, now=now)
    return funds.available


# --- Bank accounts --------------------------------------------------------------------------------


def bank_account_attach(*, merchant: Merchant, token: object, staff: StaffMember) -> MerchantBankAccount:
    """Hand the PSP a bank-account token for the merchant and keep what it answers (its
    reference and last four digits), audited; a change starts the 7 days in which payouts
    wait for approval. The PSP is asked first, outside any transaction (same token, same
    account). Locks: then the bank account row (an upsert)."""
    if not isinstance(token, str) or not token.strip():
        raise InvalidRequest("token is required: the PSP's token of the bank account", param="token")
    account = gateway_account_active()
    if account is None:
        raise NotFound("no active PSP gateway: set one up first", param="gateway")
    current = bank_account_of(merchant_id=merchant.pk)
    try:
        held = gateway_build(account=account).bank_account_attach(
            token=token.strip(), reference=merchant.pk, current=current.psp_reference if current and current.gateway == account.gateway else ""
        )
    except GatewayRejected as exc:
        raise InvalidRequest(f"the PSP refused this bank account ({exc.code or 'invalid'})", param="token") from exc
    except GatewayError as exc:
        raise PspUnavailable("no answer from the PSP: try again") from exc
    return bank_account_save(merchant=merchant, gateway=account.gateway, psp_reference=held.psp_reference, last4=held.last4, staff=staff)


@atomic_service(operation="bank_account_attach")
def bank_account_save(*, merchant: Merchant, gateway: str, psp_reference: str, last4: str, staff: StaffMember) -> MerchantBankAccount:
    """Keep a bank account the PSP holds (its reference and last four digits) as where the
    merchant's payouts go, audited. Locks: the bank account row (an upsert)."""
    before = bank_account_of(merchant_id=merchant.pk)
    bank, _ = MerchantBankAccount.objects.update_or_create(
        merchant=merchant, defaults={
            "gateway": gateway, "psp_reference": psp_reference[:200], "last4": last4[-4:], "changed_at": timezone.now(), "changed_by": staff,
        },
    )
    audit_record(
        action="bank_account.attach" if before is None else "bank_account.change", target_type="merchant", target_id=merchant.pk,
        before={"gateway": before.gateway, "last4": before.last4} if before else None, after={"gateway": gateway, "last4": bank.last4},
        actor=f"user:{staff.user.get_username()}" if staff.user_id else None,
    )
    return bank


# --- Making a payout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Made:
    payout: Payout | None  # None: nothing to pay out (a scheduled run's zero balance, or its day's payout made already)


def _payout_make(
    *, merchant: Merchant, asset_code: str, amount: int | None, origin: str, schedule_day: date | None = None,
    retry_of: Payout | None = None, staff: StaffMember | None = None, staff_alone: bool = False,
) -> _Made:
    """The checks, the move and the rows of a new payout (`amount` None: the whole available
    balance), in the caller's transaction; refuses before it writes. Made by `staff` (a
    retry), it is approved by them if they may post it `staff_alone` and nothing else asks
    for an approval, else it waits with them as its first approver.
    Locks: the merchant's balance rows in the asset (every shard) and the in-transit row, one statement."""
    asset = asset_get(asset_code=asset_code)
    if not asset.payable:
        raise AssetNotPayable(f"{asset.code} is not paid out: the tenant pays merchants out in its currencies", param="asset")
    merchant = Merchant.objects.get(pk=merchant.pk)  # the hold as committed now
    if merchant.payouts_held:
        raise PayoutsHeld("this merchant's payouts are held by the operator", param=None)
    bank = bank_account_of(merchant_id=merchant.pk)
    if bank is None:
        raise BankAccountMissing("the merchant has no bank account to pay out to", param=None)
    accounts = movement_accounts_get(customer_id=None, merchant_id=merchant.pk, system_roles=(SystemRole.PAYOUTS_IN_TRANSIT,))
    merchant_account, in_transit = accounts.merchant, accounts.system_account(SystemRole.PAYOUTS_IN_TRANSIT)
    assert merchant_account is not None
    if merchant_account.frozen:
        raise WalletFrozen("the merchant's account is frozen", param=None)
    locked = balance_rows_lock(wants=[
        BalanceWant(merchant_account, asset.code, ALL_SHARDS, creatable=False), BalanceWant(in_transit, asset.code, connection_shard()),
    ])
    if any(row.frozen for row in locked.shards(account=merchant_account, asset_code=asset.code)):
        raise WalletFrozen("the merchant's account is frozen", param=None)
    if schedule_day is not None and Payout.objects.filter(merchant=merchant, asset=asset, schedule_day=schedule_day).exists():
        return _Made(None)  # made by an earlier run (read under the rows' lock, which that run held)
    delay_days = merchant_settlement_delay_days(merchant=merchant)
    available = _available(locked=locked, account=merchant_account, asset_code=asset.code, delay_days=delay_days, now=timezone.now())
    if amount is None:
        if available <= 0:
            return _Made(None)
        amount = available
    if amount > available:
        raise InsufficientAvailable(f"the merchant's available {asset.code} balance is {available}", param="amount")
    payout_id = new_payout_id()
    legs = [Leg(merchant_account, asset.code, -amount), Leg(in_transit, asset.code, amount)]
    txn = ledger_post(kind=LedgerTransactionKind.PAYOUT, reference=payout_id, legs=legs, locked=locked)
    cooling = timezone.now() - bank.changed_at < BANK_ACCOUNT_COOLING
    reasons = [r for r in (
        "over the retrying staff member's solo limit" if staff is not None and not staff_alone else "",
        f"above the {asset.code} payout approval threshold" if asset.payout_approval_threshold is not None
        and amount > asset.payout_approval_threshold else "",
        "the bank account was changed in the last 7 days" if cooling else "",
    ) if r]
    approver, maker = (staff, None) if staff is not None and not reasons else (None, staff)
    if maker is None and cooling:
        maker = bank.changed_by  # whoever changed the account may not be the one who lets money go to it
    payout = Payout.objects.create(
        id=payout_id, merchant=merchant, asset=asset, amount=amount, origin=origin, schedule_day=schedule_day, retry_of=retry_of,
        gateway=bank.gateway, destination=bank.psp_reference, destination_last4=bank.last4, ledger_transaction=txn,
        approval_required=bool(reasons) or approver is not None, approval_reason="; ".join(reasons)[:200], approval_maker=maker,
        approved_by=approver, approved_at=timezone.now() if approver is not None else None,
    )
    payout_event_create(payout=payout, topic="payout.created")
    payout_due_mark(at=timedelta(seconds=int(settings.TALLY_PAYOUT_LEASE_SECONDS)))  # the recovery's, if its send is lost
    return _Made(payout)


@atomic_service(operation="payout_create")
def payout_create(*, merchant: Merchant, asset_code: object, amount: object) -> Payout:
    """The merchant's payout of `amount` (at most its available funds: InsufficientAvailable),
    sent to the PSP after commit unless it waits for approval. Refuses, nothing written, an
    asset not payable, a merchant without a bank account, held or frozen.
    Locks: as `_payout_make`."""
    minor = amount_to_minor(amount)
    made = _payout_make(merchant=merchant, asset_code=str(asset_code), amount=minor, origin=PayoutOrigin.MANUAL)
    assert made.payout is not None
    if not made.payout.approval_required:
        payout_submit_on_commit(payout_id=made.payout.pk)
    return made.payout


# --- Staff controls -------------------------------------------------------------------------------


@atomic_service(operation="payout_approve")
def payout_approve(*, payout: Payout, staff: StaffMember) -> Payout:
    """A staff member approves a payout waiting for approval. Within what they may post alone
    (approvals.staff_solo_posting_decide, one sum with adjustments) it is sent, the recovery
    marked due should the send be lost; beyond it, theirs is the first approval and a
    different staff member's sends it. Locks: the staff member's solo-postings lock, the
    payout row, then the due-work lock, SHARED."""
    decision = staff_solo_posting_decide(staff=staff, asset_code=payout.asset_id, amount=payout.amount, merchant=payout.merchant)
    locked = payout_lock(payout_id=payout.pk)
    if locked is None:
        raise NotFound("no such payout", param="payout")
    if locked.status != PayoutStatus.PENDING or not locked.approval_required or locked.approved_at is not None:
        raise InvalidState(f"this payout is {locked.status} and waits for no approval")
    if locked.approval_maker_id == staff.pk:
        raise ApproverIsMaker("a payout")
    before = {"approval_maker": locked.approval_maker_id}
    if locked.approval_maker_id is None and not decision.alone:
        locked.approval_maker = staff  # over this staff member's solo limit: a second one must approve
        locked.save(update_fields=["approval_maker", "updated"])
        action = "payout.approve_first"
    else:
        locked.approved_by, locked.approved_at = staff, timezone.now()
        locked.save(update_fields=["approved_by", "approved_at", "updated"])
        payout_submit_on_commit(payout_id=locked.pk)
        payout_due_mark(at=timedelta(seconds=int(settings.TALLY_PAYOUT_LEASE_SECONDS)))  # the recovery's, if its send is lost
        action = "payout.approve"
    audit_record(action=action, target_type="payout", target_id=locked.pk, before=before, after={
        "staff": staff.pk, "amount": locked.amount, "asset": locked.asset_id, "posted_alone_in_window": decision.posted_alone_in_window,
        "threshold": decision.limits.threshold,
    })
    return locked


@atomic_service(operation="payout_retry")
def payout_retry(*, payout: Payout, staff: StaffMember) -> Payout:
    """A new payout of a failed one's amount (the funds came back to the merchant), made by a
    staff member: sent on their word if it needs no approval and is within what they may post
    alone, else it waits for a second staff member. Locks: the staff member's solo-postings
    lock, the failed payout's row, then as `_payout_make`."""
    decision = staff_solo_posting_decide(staff=staff, asset_code=payout.asset_id, amount=payout.amount, merchant=payout.merchant)
    failed = payout_lock(payout_id=payout.pk)
    if failed is None or failed.status != PayoutStatus.FAILED:
        raise InvalidState("only a failed payout is retried")
    if Payout.objects.filter(retry_of=failed).exclude(status__in=[PayoutStatus.FAILED, PayoutStatus.CANCELED]).exists():
        raise InvalidState("this payout was retried already")
    made = _payout_make(merchant=failed.merchant, asset_code=failed.asset_id, amount=failed.amount, origin=PayoutOrigin.RETRY,
                        retry_of=failed, staff=staff, staff_alone=decision.alone)
    retry = made.payout
    assert retry is not None
    if retry.approved_at is not None:
        payout_submit_on_commit(payout_id=retry.pk)
    audit_record(action="payout.retry", target_type="payout", target_id=failed.pk, after={
        "retry": retry.pk, "staff": staff.pk, "waits_for_approval": retry.approved_at is None, "amount": retry.amount})
    return retry


@atomic_service(operation="payout_cancel")
def payout_cancel(*, payout: Payout, reason: str = "") -> Payout:
    """Cancel a payout the PSP was never asked to make (waiting for approval, or held): the
    funds go back to the merchant. Locks: the payout row, then the balance rows."""
    locked = payout_lock(payout_id=payout.pk)
    if locked is None:
        raise NotFound("no such payout", param="payout")
    if locked.status != PayoutStatus.PENDING or locked.attempts > 0:
        raise PayoutNotCancelable(f"this payout is {locked.status}{' and the PSP may have it' if locked.attempts else ''}: it cannot be"
                                  " canceled", param=None)
    payout_funds_return(payout=locked, status=PayoutStatus.CANCELED, failure_code="")
    audit_record(action="payout.cancel", target_type="payout", target_id=locked.pk, reason=reason,
                 before={"status": PayoutStatus.PENDING}, after={"status": PayoutStatus.CANCELED, "returned": locked.returned_transaction_id})
    return locked


# --- The operator queue ----------------------------------------------------------------------------

REVIEW_OUTCOMES = ("paid", "failed")


@dataclass(frozen=True)
class PayoutStopFacts:
    """What `payout_review_stop_prepare` saw of a payout and heard from the PSP: the stop goes
    ahead only if the payout is still as seen (`fence`, `status`, `psp_reference`)."""

    payout_id: str
    fence: int
    status: str
    psp_reference: str
    heard: str  # the PSP's answer (or silence), kept in the stop's reason
    holds_ours: str = ""  # the PSP's payout of it, matching ours: the saga settles it, no stop
    refused: str = ""  # why it could not be stopped as it was seen (the PSP was not asked)


def payout_review_stop_prepare(*, payout: Payout) -> PayoutStopFacts:
    """The payout as it is now and what the PSP holds of it, for `payout_review_stop`: a read
    of the PSP, to be made with no transaction open (callers in one, as the admin's
    idempotency claim, prepare first). Refuses nothing: the stop does, on these facts.
    Locks: none."""
    current = Payout.objects.filter(pk=payout.pk).first()
    if current is None:
        raise NotFound("no such payout", param="payout")
    seen = PayoutStopFacts(payout_id=current.pk, fence=current.fence, status=current.status, psp_reference=current.psp_reference, heard="")
    try:
        _stoppable(current)
    except InvalidState as exc:
        return replace(seen, refused=exc.message)
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=current.gateway))
        found = gateway.payouts_of(reference=current.pk, destination=current.destination, psp_reference=current.psp_reference,
                                   since=current.created)
    except (GatewayError, NotFound) as exc:
        return replace(seen, heard=f"the PSP did not answer ({exc})")
    matching = [r for r in found if r.amount == current.amount and r.currency.upper() == current.asset_id.upper()]
    if matching:
        return replace(seen, holds_ours=f"{matching[0].psp_reference} ({matching[0].status})")
    heard = f"the PSP holds {', '.join(f'{r.psp_reference} ({r.status})' for r in found)}" if found else "the PSP holds no payout of it"
    return replace(seen, heard=heard)


def payout_review_stop(*, payout: Payout, staff: StaffMember, reason: object, facts: PayoutStopFacts | None = None) -> Payout:
    """Stop for an operator a payout the saga cannot settle (the PSP never heard of it, or
    keeps failing to answer, past its lease), audited: it joins the queue that
    `payout_review_resolve` empties. Only a payout the PSP may have (pending and tried, or in
    transit), with no live lease and not in the queue; one the PSP holds as ours, matching,
    is refused (the saga settles it by the PSP's word). The PSP's answer comes from `facts`
    (`payout_review_stop_prepare`, asked here when not given: call this with no transaction
    open then), and is kept in the reason. The payout must be as the facts saw it: a send, an
    answer or a webhook that moved it meanwhile (its fence, status or PSP reference changed)
    refuses the stop, whose facts are stale. Locks: the payout row."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("reason is required: why the PSP cannot settle this payout", param="reason")
    if facts is None:
        facts = payout_review_stop_prepare(payout=payout)
    if facts.payout_id != payout.pk:
        raise InvalidRequest("these facts are another payout's", param="payout")
    text = f"stopped by staff: {reason.strip()}; {facts.heard}"

    def stop() -> Payout:
        locked = payout_lock(payout_id=payout.pk)
        if locked is None:
            raise NotFound("no such payout", param="payout")
        _stoppable(locked)
        if facts.refused:
            raise InvalidState(facts.refused)
        if (locked.fence, locked.status, locked.psp_reference) != (facts.fence, facts.status, facts.psp_reference):
            raise InvalidState(f"this payout moved on while the PSP was asked (it is {locked.status} now"
                               f"{f', PSP payout {locked.psp_reference}' if locked.psp_reference else ''}): look at it again")
        if facts.holds_ours:
            raise InvalidState(f"the PSP holds payout {facts.holds_ours} of it: the saga settles it by that")
        payout_review_stop_locked(locked, reason=text, staff=staff)
        return locked

    return run_atomic(stop, operation="payout_review_stop")


def _stoppable(payout: Payout) -> None:
    if payout.review_at is not None:
        raise InvalidState("this payout waits for an operator already")
    if not (payout.status == PayoutStatus.IN_TRANSIT or (payout.status == PayoutStatus.PENDING and payout.attempts > 0)):
        raise InvalidState(f"only a payout the PSP may have is stopped (this one is {payout.status}"
                           f"{', never sent: cancel it instead' if payout.status == PayoutStatus.PENDING else ''})")
    if payout.lease_expires_at is not None and payout.lease_expires_at > timezone.now():
        raise InvalidState("a send of this payout is under way: try again once its lease ends")


@atomic_service(operation="payout_review_resolve")
def payout_review_resolve(*, payout: Payout, staff: StaffMember, outcome: object, reason: object) -> Payout:
    """Resolve a payout in the operator queue, audited, by two staff members: the first
    proposes `outcome`, a second confirms it and it is applied. Paid: the money left for the
    bank account (in transit -> PSP settlement). Failed: the money never left us, or is back
    at the PSP; for a payout the PSP may have (it named one, or was asked) that is not staff's
    word alone: the payout leaves the queue owing its money back (`return_owed_at`) and
    `payout_return` asks the PSP to take back what it sent on after this commit, the merchant
    credited only once it has (a refusal puts the payout back in the queue; no answer is the
    recovery's to ask again). A payout failed or canceled here already (stopped because the
    PSP says it sent it) moves no money on either: it leaves the queue, the operator having
    settled it with the merchant. A different outcome is a new proposal, its proposer's; the
    proposer never confirms; any word from the PSP meanwhile voids the proposal (payout_saga).
    Locks: the payout row, then the balance rows (ledger_post), then the due-work lock, SHARED."""
    if outcome not in REVIEW_OUTCOMES:
        raise InvalidRequest("outcome must be paid or failed", param="outcome")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("reason is required: what the PSP's records say", param="reason")
    locked = payout_lock(payout_id=payout.pk)
    if locked is None:
        raise NotFound("no such payout", param="payout")
    if locked.review_at is None:
        raise InvalidState(f"this payout is {locked.status} and waits for no operator")
    if outcome == "paid" and not locked.psp_reference:
        raise InvalidState("the PSP never named a payout of it: it cannot be marked paid")
    if outcome == "paid" and locked.status in (PayoutStatus.FAILED, PayoutStatus.CANCELED):
        raise InvalidState(f"this payout is {locked.status}, its money back with the merchant: settle that with the merchant,"
                           " then mark it failed")
    before = {"status": locked.status, "review_outcome": locked.review_outcome, "review_maker": locked.review_maker_id}
    if locked.review_maker_id is None or locked.review_outcome != outcome:
        locked.review_maker, locked.review_outcome = staff, str(outcome)
        locked.save(update_fields=["review_maker", "review_outcome", "updated"])
        audit_record(action="payout.review_propose", target_type="payout", target_id=locked.pk, reason=reason.strip()[:500],
                     before=before, after={"review_outcome": outcome, "review_maker": staff.pk})
        return locked
    if locked.review_maker_id == staff.pk:
        raise ApproverIsMaker("a payout's resolution")
    unsettled = locked.status in (PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT, PayoutStatus.PAID)
    returning = outcome == "failed" and unsettled and bool(locked.psp_reference or locked.attempts > 0)
    if returning:
        locked.return_owed_at = locked.return_owed_at or timezone.now()
        locked.return_failure_code = locked.return_failure_code or OPERATOR_FAILED
        payout_due_mark()  # the recovery's, if the return after this commit is lost or not answered
        payout_return_on_commit(payout_id=locked.pk)
    elif outcome == "failed" and unsettled:
        payout_funds_back(payout=locked, failure_code=locked.return_failure_code or OPERATOR_FAILED)
    elif outcome == "paid" and locked.status in (PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT):
        payout_paid_move(payout=locked)
    if not returning:
        locked.return_owed_at = None
    locked.review_at, locked.review_resolved_by, locked.review_resolved_at = None, staff, timezone.now()
    locked.save(update_fields=["review_at", "return_owed_at", "return_failure_code", "review_resolved_by", "review_resolved_at", "updated"])
    audit_record(action="payout.review_resolve", target_type="payout", target_id=locked.pk, reason=reason.strip()[:500], before=before,
                 after={"status": locked.status, "outcome": outcome, "proposed_by": locked.review_maker_id, "confirmed_by": staff.pk,
                        "returning": returning})
    return locked


@atomic_service(operation="payouts_hold")
def merchant_payouts_hold(*, merchant: Merchant, held: bool, reason: str = "") -> Merchant:
    """Hold (`held`) or release a merchant's payouts, audited: while held none is made, and
    none made already is sent (a send taking its lease as the hold commits waits for it, or it
    for the send: `merchant_share_lock`). A release sends those waiting. Locks: the merchant row."""
    locked = merchant_lock(merchant_id=merchant.pk)
    if locked.payouts_held == held:
        return locked
    before = {"payouts_held": locked.payouts_held, "reason": locked.payouts_held_reason}
    locked.payouts_held, locked.payouts_held_reason, locked.payouts_held_at = held, reason[:500] if held else "", timezone.now() if held else None
    locked.save(update_fields=["payouts_held", "payouts_held_reason", "payouts_held_at"])
    audit_record(action="payouts.hold" if held else "payouts.release", target_type="merchant", target_id=locked.pk, reason=reason,
                 before=before, after={"payouts_held": held})
    if not held:
        payout_due_mark()  # the recovery sends what waited
    return locked


@atomic_service(operation="payout_schedule_set")
def merchant_payout_schedule_set(*, merchant: Merchant, schedule: str, weekday: int | None = None) -> Merchant:
    """A merchant's payout schedule: daily, weekly on `weekday` (0 Monday .. 6 Sunday) or
    manual, audited. Locks: the merchant row."""
    if schedule not in PayoutSchedule.values:
        raise InvalidRequest("schedule must be daily, weekly or manual", param="schedule")
    if (schedule == PayoutSchedule.WEEKLY) != (weekday is not None) or (weekday is not None and not 0 <= weekday <= 6):
        raise InvalidRequest("a weekly schedule takes a weekday from 0 (Monday) to 6 (Sunday), the others none", param="weekday")
    locked = merchant_lock(merchant_id=merchant.pk)
    before = {"schedule": locked.payout_schedule, "weekday": locked.payout_weekday}
    locked.payout_schedule, locked.payout_weekday = schedule, weekday
    locked.save(update_fields=["payout_schedule", "payout_weekday"])
    audit_record(action="payouts.schedule", target_type="merchant", target_id=locked.pk, before=before,
                 after={"schedule": schedule, "weekday": weekday})
    return locked


# --- Scheduled payouts ----------------------------------------------------------------------------


def merchants_due(*, day: date) -> list[str]:
    """Ids of the merchants whose schedule pays out on `day` (UTC): daily, or weekly on its weekday."""
    due = Merchant.objects.filter(payouts_held=False, bank_account__isnull=False, account__frozen=False)
    return list(
        (due.filter(payout_schedule=PayoutSchedule.DAILY) | due.filter(payout_schedule=PayoutSchedule.WEEKLY, payout_weekday=day.weekday()))
        .order_by("pk").values_list("pk", flat=True)
    )


@atomic_service(operation="payout_scheduled")
def _scheduled_make(*, merchant_id: str, asset_code: str, day: date) -> Payout | None:
    made = _payout_make(merchant=Merchant(pk=merchant_id), asset_code=asset_code, amount=None, origin=PayoutOrigin.SCHEDULED,
                        schedule_day=day)
    return made.payout


def payouts_scheduled_run(*, day: date | None = None, concurrency: int | None = None) -> dict[str, int]:
    """One tenant's scheduled payouts for `day` (today, UTC): for each merchant due and each
    payable asset, one payout of the whole available balance, each in its own transaction,
    then sent to the PSP from `concurrency` threads (settings.TALLY_PAYOUT_SUBMIT_CONCURRENCY).
    Idempotent per merchant, asset and day: a second run makes none again. Returns counts.
    Locks: the tenant's schedule lock (session advisory, tried); per payout, as `_payout_make`
    then `payout_submit`."""
    day = day or timezone.now().date()
    with payout_schedule_lock() as taken:
        if not taken:
            return {"skipped": 1}
        assets = list(Asset.objects.filter(payable=True).values_list("code", flat=True))
        counts: dict[str, int] = {}
        work: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        for merchant_id in merchants_due(day=day):
            for code in assets:
                work.put((merchant_id, code))
        schema = str(getattr(connection, "schema_name", "public"))
        lock = threading.Lock()

        def drain() -> None:
            while (item := work.get()) is not None:
                outcome = _scheduled_one(merchant_id=item[0], asset_code=item[1], day=day)
                with lock:
                    counts[outcome] = counts.get(outcome, 0) + 1

        def worker() -> None:
            connection.set_schema(schema)  # type: ignore[attr-defined]  # django-tenants' database wrapper
            try:
                drain()
            finally:
                connections.close_all()

        # The PSP calls (a round trip each) overlap in threads, each with its own connection.
        threads = max(1, concurrency or int(settings.TALLY_PAYOUT_SUBMIT_CONCURRENCY))
        for _ in range(threads):
            work.put(None)
        if threads == 1:
            drain()  # on this connection (and in its transaction, if the caller holds one)
            return counts
        started = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
        for thread in started:
            thread.start()
        for thread in started:
            thread.join()
        return counts


def _scheduled_one(*, merchant_id: str, asset_code: str, day: date) -> str:
    """Make and send one scheduled payout; an error is logged and counted, the run goes on."""
    try:
        payout = _scheduled_make(merchant_id=merchant_id, asset_code=asset_code, day=day)
        if payout is None:
            return "nothing_to_pay"
        if payout.approval_required:
            return "awaiting_approval"
        return payout_submit(payout_id=payout.pk)
    except (PayoutsHeld, WalletFrozen, BankAccountMissing) as refused:
        return str(refused.code)
    except Exception:
        logger.exception("a scheduled payout failed; the run goes on", extra={"merchant": merchant_id, "asset": asset_code})
        return "error"
