"""Maker-checker for staff postings: what one staff member posts alone in one asset over the
tenant's rolling window (in all, and to any one party) stays within the tenant's threshold;
beyond it a posting is a proposal (PendingAdjustment) until another staff member approves."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from payments.errors import ApproverIsMaker
from payments.locks import pending_adjustment_lock
from payments.models import Adjustment, PendingAdjustment, PendingAdjustmentStatus
from payments.selectors import staff_solo_postings_total
from payments.services.adjustments import adjustment_create, adjustment_request_check
from tenants.approvals import ApprovalLimits, ApprovalSettingInvalid, approval_limits
from tenants.selectors import tenant_extra_settings_fresh
from wallets.errors import InvalidState, NotFound
from wallets.locks import staff_solo_postings_lock
from wallets.models import Customer, Merchant, StaffMember
from wallets.money import amount_to_minor
from wallets.selectors import asset_get
from wallets.services.audit import audit_record
from wallets.transactions import atomic_service

logger = logging.getLogger("tally.payments")


def adjustment_approval_limits(*, asset_code: str) -> ApprovalLimits:
    """The tenant's threshold for `asset_code` and its window, read from its row now. A
    stored setting not of the documented form (written around `Tenant.clean()`) fails
    closed, logged: a threshold of 0, so every solo posting waits for a second staff member."""
    try:
        return approval_limits(extra=tenant_extra_settings_fresh(), asset_code=asset_code)
    except ApprovalSettingInvalid as exc:
        logger.error("maker-checker setting invalid: every staff posting waits for approval", extra={"error": str(exc)})
        return ApprovalLimits(threshold=0, window=timedelta(0))


@dataclass(frozen=True)
class SoloPostingDecision:
    """Whether a staff member may post `amount` alone now, and what it was decided on."""

    alone: bool
    posted_alone_in_window: int
    posted_alone_to_party_in_window: int
    limits: ApprovalLimits


def staff_solo_posting_decide(
    *, staff: StaffMember, asset_code: str, amount: int, customer: Customer | None = None, merchant: Merchant | None = None
) -> SoloPostingDecision:
    """May `staff` post `amount` of `asset_code` to this party alone? Call it inside the
    transaction that posts (or proposes): its lock is held until that commits.
    Locks: `staff_solo_postings_lock` (staff member, asset) first, so two concurrent postings
    of one staff member in one asset are counted one after the other; no row."""
    staff_solo_postings_lock(staff_id=staff.pk, asset_code=asset_code)
    limits = adjustment_approval_limits(asset_code=asset_code)
    posted = staff_solo_postings_total(
        staff=staff, asset_code=asset_code, since=timezone.now() - limits.window, customer=customer, merchant=merchant
    )
    alone = posted.total + amount <= limits.threshold and posted.to_party + amount <= limits.threshold
    return SoloPostingDecision(alone=alone, posted_alone_in_window=posted.total, posted_alone_to_party_in_window=posted.to_party, limits=limits)


@atomic_service(operation="adjustment_request")
def adjustment_request(
    *,
    maker: StaffMember,
    customer: Customer | None = None,
    merchant: Merchant | None = None,
    asset_code: str,
    amount: object,
    direction: str,
    reason: str,
) -> Adjustment | PendingAdjustment:
    """Posted now if `staff_solo_posting_decide` lets `maker` post it alone, else held for a
    second staff member (audited). Locks: as staff_solo_posting_decide, then adjustment_create."""
    minor = amount_to_minor(amount)
    party = adjustment_request_check(customer=customer, merchant=merchant, direction=direction, reason=reason)
    asset = asset_get(asset_code=asset_code)
    decision = staff_solo_posting_decide(staff=maker, asset_code=asset.code, amount=minor, customer=customer, merchant=merchant)
    if decision.alone:
        return adjustment_create(
            staff=maker, customer=customer, merchant=merchant, asset_code=asset.code, amount=minor, direction=direction, reason=reason
        )
    pending = PendingAdjustment.objects.create(
        maker=maker, customer=customer, merchant=merchant, asset=asset, amount=minor, direction=direction, reason=reason[:500]
    )
    audit_record(
        action="adjustment.propose", target_type="pending_adjustment", target_id=pending.pk, reason=pending.reason,
        after={"party": party.pk, "asset": asset.code, "amount": minor, "direction": direction, "maker": maker.pk,
               "status": pending.status, "posted_alone_in_window": decision.posted_alone_in_window,
               "posted_alone_to_party_in_window": decision.posted_alone_to_party_in_window,
               "threshold": decision.limits.threshold, "window_seconds": decision.limits.window.total_seconds()},
    )
    return pending


def _decidable(*, pending_id: str, checker: StaffMember) -> PendingAdjustment:
    locked = pending_adjustment_lock(pending_id=pending_id)
    if locked is None:
        raise NotFound("no such pending adjustment", param="pending_adjustment")
    if locked.status != PendingAdjustmentStatus.PENDING:
        raise InvalidState(f"this adjustment is already {locked.status}")
    if locked.maker_id == checker.pk:
        raise ApproverIsMaker()
    return locked


@atomic_service(operation="pending_adjustment_approve")
def pending_adjustment_approve(*, pending: PendingAdjustment, checker: StaffMember) -> Adjustment:
    """Approve and post a proposed adjustment; the checker must not be its maker.
    Locks: the pending adjustment row, then as adjustment_create."""
    locked = _decidable(pending_id=pending.pk, checker=checker)
    adjustment = adjustment_create(
        staff=locked.maker, customer=locked.customer, merchant=locked.merchant, asset_code=locked.asset_id,
        amount=locked.amount, direction=locked.direction, reason=locked.reason,
    )
    PendingAdjustment.objects.filter(pk=locked.pk).update(
        status=PendingAdjustmentStatus.APPROVED, checker=checker, adjustment=adjustment, decided_at=timezone.now()
    )
    audit_record(
        action="adjustment.approve", target_type="pending_adjustment", target_id=locked.pk,
        before={"status": locked.status}, after={"status": PendingAdjustmentStatus.APPROVED, "checker": checker.pk, "adjustment": adjustment.pk},
    )
    return adjustment


@atomic_service(operation="pending_adjustment_reject")
def pending_adjustment_reject(*, pending: PendingAdjustment, checker: StaffMember, reason: str = "") -> PendingAdjustment:
    """Reject a proposed adjustment (nothing is posted). Locks: the pending adjustment row."""
    locked = _decidable(pending_id=pending.pk, checker=checker)
    PendingAdjustment.objects.filter(pk=locked.pk).update(status=PendingAdjustmentStatus.REJECTED, checker=checker, decided_at=timezone.now())
    audit_record(
        action="adjustment.reject", target_type="pending_adjustment", target_id=locked.pk, reason=reason,
        before={"status": locked.status}, after={"status": PendingAdjustmentStatus.REJECTED, "checker": checker.pk},
    )
    locked.refresh_from_db()
    return locked
