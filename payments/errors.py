"""Failures only the payments service raises. The shared families (not found, refusals,
invalid state, conflicts) are in wallets.errors; the API maps every code in one place."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import InvalidState, NotPermitted


class PaymentErrorCode(StrEnum):
    REFUND_WINDOW_CLOSED = "refund_window_closed"
    CHARGE_BY_CUSTOMER_ID_NOT_PERMITTED = "charge_by_customer_id_not_permitted"
    APPROVER_IS_MAKER = "approver_is_maker"
    ADJUSTMENT_APPROVAL_REQUIRED = "adjustment_approval_required"


class RefundWindowClosed(InvalidState):
    """Terminals refund only what they took today (SPEC 4): older refunds go through the
    merchant's back office, where someone accountable decides."""

    code: ClassVar[StrEnum] = PaymentErrorCode.REFUND_WINDOW_CLOSED


class ChargeByCustomerIdNotPermitted(NotPermitted):
    """SPEC 4: charging by bare customer id needs the tenant's setting or the customer's
    mandate for this merchant; otherwise the customer's payment token (QR) is the way."""

    code: ClassVar[StrEnum] = PaymentErrorCode.CHARGE_BY_CUSTOMER_ID_NOT_PERMITTED

    def __init__(self) -> None:
        super().__init__(
            "this merchant may not charge the customer by id: use the customer's payment token, or ask the customer for a mandate",
            param="customer",
        )


class ApproverIsMaker(NotPermitted):
    """Maker-checker: an adjustment above the tenant's threshold is approved by a staff
    member other than the one who proposed it."""

    code: ClassVar[StrEnum] = PaymentErrorCode.APPROVER_IS_MAKER

    def __init__(self) -> None:
        super().__init__("an adjustment must be approved by a different staff member than the one who proposed it", param="checker")


class AdjustmentApprovalRequired(NotPermitted):
    """An adjustment above the tenant's approval threshold cannot be posted by one staff
    member's API key: it is proposed in the back office, where a second one approves it."""

    code: ClassVar[StrEnum] = PaymentErrorCode.ADJUSTMENT_APPROVAL_REQUIRED

    def __init__(self, *, threshold: int) -> None:
        super().__init__(
            f"this adjustment is above the tenant's approval threshold ({threshold}): propose it in the back office,"
            " where a second staff member approves it",
            param="amount",
        )
