"""Staff adjustments: a correction against the adjustments system account, with a reason."""

from __future__ import annotations

from payments.models import Adjustment, AdjustmentDirection
from payments.services.outbox import epoch_seconds, outbox_event_create
from wallets import ids
from wallets.errors import InvalidRequest
from wallets.models import Customer, LedgerTransactionKind, Merchant, StaffMember, SystemRole
from wallets.money import amount_to_minor
from wallets.selectors import account_of, asset_get, system_account_get
from wallets.services.audit import audit_record
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service


def adjustment_request_check(*, customer: Customer | None, merchant: Merchant | None, direction: str, reason: object) -> Customer | Merchant:
    """The one party an adjustment is for, once its direction and reason are valid; reads nothing."""
    if (customer is None) == (merchant is None):
        raise InvalidRequest("give exactly one of customer or merchant", param="customer")
    if direction not in AdjustmentDirection.values:
        raise InvalidRequest("direction must be credit or debit", param="direction")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("a reason is required", param="reason")
    return customer if customer is not None else merchant  # type: ignore[return-value]


@atomic_service(operation="adjustment_create")
def adjustment_create(
    *,
    staff: StaffMember,
    customer: Customer | None = None,
    merchant: Merchant | None = None,
    asset_code: str,
    amount: object,
    direction: str,
    reason: str,
) -> Adjustment:
    """Credit or debit a customer or a merchant against the adjustments system account.
    Works on frozen wallets, but never takes a balance below zero or above the cap.
    Locks: see ledger_post."""
    minor = amount_to_minor(amount)
    party = adjustment_request_check(customer=customer, merchant=merchant, direction=direction, reason=reason)
    asset = asset_get(asset_code=asset_code)
    account = account_of(party=party)
    sign = 1 if direction == AdjustmentDirection.CREDIT else -1
    adjustment_id = ids.new_adjustment_id()
    txn = ledger_post(
        kind=LedgerTransactionKind.ADJUSTMENT,
        reference=adjustment_id,
        legs=[Leg(account, asset.code, sign * minor), Leg(system_account_get(role=SystemRole.ADJUSTMENTS), asset.code, -sign * minor)],
        allow_frozen=True,
    )
    adjustment = Adjustment.objects.create(
        id=adjustment_id, staff=staff, customer=customer, merchant=merchant, asset=asset, amount=minor,
        direction=direction, reason=reason[:500], ledger_transaction=txn,
    )
    audit_record(
        action="adjustment.create", target_type="adjustment", target_id=adjustment.id, reason=adjustment.reason,
        after={"party": party.pk, "asset": asset.code, "amount": minor, "direction": direction, "staff": staff.pk,
               "ledger_transaction": txn.pk},
    )
    # The event goes to the merchant (its webhooks, GET /v1/merchant/events): who posted it
    # and the staff's free-text reason stay in the audit log and the admin.
    outbox_event_create(
        topic="adjustment.created",
        payload={
            "id": adjustment.id, "object": "adjustment", "customer": customer.pk if customer else None,
            "merchant": merchant.pk if merchant else None, "asset": asset.code, "amount": minor,
            "direction": direction, "created": epoch_seconds(adjustment.created),
        },
    )
    return adjustment
