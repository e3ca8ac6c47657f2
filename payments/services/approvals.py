"""Maker-checker for staff adjustments: one staff member may post alone what keeps the sum
of their adjustments to one party in one asset, over a rolling window, within the tenant's
threshold. Whatever would cross it is a proposal (PendingAdjustment) until a second staff
member approves it. The admin and the admin API go through `adjustment_request`."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from payments.errors import ApproverIsMaker
from payments.locks import pending_adjustment_lock
from payments.models import Adjustment, PendingAdjustment, PendingAdjustmentStatus
from payments.selectors import adjustments_posted_alone_total
from payments.services.adjustments import adjustment_create, adjustment_request_check
from tenants.selectors import tenant_extra_settings_fresh
from wallets.errors import InvalidState, NotFound
from wallets.locks import staff_member_lock
from wallets.models import Customer, Merchant, StaffMember
from wallets.money import amount_to_minor
from wallets.selectors import asset_get
from wallets.services.audit import audit_record
from wallets.transactions import atomic_service

# Minor units of any asset, and hours; a tenant sets its own in Tenant.extra_settings:
# {"adjustment_approval_threshold": 100000, "adjustment_approval_thresholds": {"EUR": 50000},
#  "adjustment_approval_window_hours": 24}
ADJUSTMENT_APPROVAL_THRESHOLD_DEFAULT = 100_000
ADJUSTMENT_APPROVAL_WINDOW_HOURS_DEFAULT = 24


def adjustment_approval_limits(*, asset_code: str) -> tuple[int, timedelta]:
    """Most (minor units of `asset_code`) one staff member may post alone to one party
    within the approval window, and that window: the tenant's settings read from its row
    now (tenant_extra_settings_fresh), in one query."""
    extra = tenant_extra_settings_fresh()
    per_asset = extra.get("adjustment_approval_thresholds") or {}
    threshold = per_asset.get(asset_code, extra.get("adjustment_approval_threshold", ADJUSTMENT_APPROVAL_THRESHOLD_DEFAULT))
    hours = extra.get("adjustment_approval_window_hours", ADJUSTMENT_APPROVAL_WINDOW_HOURS_DEFAULT)
    return int(threshold), timedelta(hours=int(hours))


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
    """Posted now if it keeps what `maker` posted alone to this party and asset within the
    window at or under the threshold, else held for a second staff member (audited).

    Locks: the maker's StaffMember row first, so two concurrent requests of one staff
    member are counted one after the other; then, when posted, as adjustment_create."""
    minor = amount_to_minor(amount)
    party = adjustment_request_check(customer=customer, merchant=merchant, direction=direction, reason=reason)
    asset = asset_get(asset_code=asset_code)
    staff_member_lock(staff_id=maker.pk)
    threshold, window = adjustment_approval_limits(asset_code=asset.code)
    since = timezone.now() - window
    already = adjustments_posted_alone_total(staff=maker, customer=customer, merchant=merchant, asset_code=asset.code, since=since)
    if already + minor <= threshold:
        return adjustment_create(
            staff=maker, customer=customer, merchant=merchant, asset_code=asset.code, amount=minor, direction=direction, reason=reason
        )
    pending = PendingAdjustment.objects.create(
        maker=maker, customer=customer, merchant=merchant, asset=asset, amount=minor, direction=direction, reason=reason[:500]
    )
    audit_record(
        action="adjustment.propose", target_type="pending_adjustment", target_id=pending.pk, reason=pending.reason,
        after={"party": party.pk, "asset": asset.code, "amount": minor, "direction": direction, "maker": maker.pk,
               "status": pending.status, "posted_alone_in_window": already},
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
