"""Failures only the payments service raises; the shared families are in wallets.errors."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import BusinessRefusal, InvalidRequest, InvalidState, NotPermitted, Unavailable


class PaymentErrorCode(StrEnum):
    REFUND_WINDOW_CLOSED = "refund_window_closed"
    CHARGE_BY_CUSTOMER_ID_NOT_PERMITTED = "charge_by_customer_id_not_permitted"
    APPROVER_IS_MAKER = "approver_is_maker"
    CARD_DECLINED = "card_declined"
    PSP_REFUSED = "psp_refused"
    PSP_UNAVAILABLE = "psp_unavailable"
    PSP_NOT_CONFIGURED = "psp_not_configured"
    ASSET_NOT_TOP_UPABLE = "asset_not_top_upable"
    SIGNATURE_INVALID = "signature_invalid"
    SIGNATURE_STALE = "signature_timestamp_out_of_tolerance"
    EVENT_INVALID = "event_invalid"
    FEE_SCHEDULE_START_REFUSED = "fee_schedule_start_refused"
    INSUFFICIENT_AVAILABLE = "insufficient_available"
    ASSET_NOT_PAYABLE = "asset_not_payable"
    BANK_ACCOUNT_MISSING = "bank_account_missing"
    PAYOUTS_HELD = "payouts_held"
    PAYOUT_NOT_CANCELABLE = "payout_not_cancelable"


class RefundWindowClosed(InvalidState):
    """Terminals refund only what they took today (SPEC 4); the merchant refunds older ones."""

    code: ClassVar[StrEnum] = PaymentErrorCode.REFUND_WINDOW_CLOSED


class ChargeByCustomerIdNotPermitted(NotPermitted):
    """SPEC 4: charging by bare customer id needs the tenant's setting or a mandate."""

    code: ClassVar[StrEnum] = PaymentErrorCode.CHARGE_BY_CUSTOMER_ID_NOT_PERMITTED

    def __init__(self) -> None:
        super().__init__(
            "this merchant may not charge the customer by id: use the customer's payment token, or ask the customer for a mandate",
            param="customer",
        )


class ApproverIsMaker(NotPermitted):
    """Maker-checker: the approver of an adjustment (or payout) is not the staff member who proposed it."""

    code: ClassVar[StrEnum] = PaymentErrorCode.APPROVER_IS_MAKER

    def __init__(self, what: str = "an adjustment") -> None:
        super().__init__(f"{what} must be approved by a different staff member than the one who proposed it", param="checker")


class FeeScheduleStartRefused(InvalidState):
    """A schedule starts later than every process can know it, and not when another of its
    asset and merchant starts: a rule of the clock and the stored schedules, not of the input."""

    code: ClassVar[StrEnum] = PaymentErrorCode.FEE_SCHEDULE_START_REFUSED

    def __init__(self, message: str) -> None:
        super().__init__(message, param="valid_from")


class CardDeclined(BusinessRefusal):
    """The PSP declined the card (SPEC 5: a 402, stored and replayed)."""

    code: ClassVar[StrEnum] = PaymentErrorCode.CARD_DECLINED


class PspRefused(BusinessRefusal):
    """Not charged, and final like a decline (a 402): the PSP refused the request itself (an
    amount below its minimum), or an operator found no charge at the PSP."""

    code: ClassVar[StrEnum] = PaymentErrorCode.PSP_REFUSED


class PspUnavailable(Unavailable):
    """No answer from the PSP (timeout, 5xx), the outcome unknown: retryable with the same key."""

    code: ClassVar[StrEnum] = PaymentErrorCode.PSP_UNAVAILABLE
    retryable = True
    retry_after_seconds = 2


class PspKeyWindowPassed(PspUnavailable):
    """Older than the PSP keeps idempotency keys (asking again could charge twice): an
    operator settles it. The client sees an ordinary `psp_unavailable`."""


class PspChargeMismatch(PspUnavailable):
    """The PSP's charge under the top-up's id is not its amount and currency: nothing is
    credited, an operator settles it. The client sees an ordinary `psp_unavailable`."""


class PspNotConfigured(NotPermitted):
    """No active card gateway: a 403, not a 503 (retrying will not help)."""

    code: ClassVar[StrEnum] = PaymentErrorCode.PSP_NOT_CONFIGURED


class AssetNotTopUpable(InvalidRequest):
    """Card top-ups buy money: the main or a regional currency, never points or carbon credits."""

    code: ClassVar[StrEnum] = PaymentErrorCode.ASSET_NOT_TOP_UPABLE


class PspSignatureInvalid(InvalidRequest):
    code: ClassVar[StrEnum] = PaymentErrorCode.SIGNATURE_INVALID


class PspSignatureStale(InvalidRequest):
    code: ClassVar[StrEnum] = PaymentErrorCode.SIGNATURE_STALE


class PspEventInvalid(InvalidRequest):
    code: ClassVar[StrEnum] = PaymentErrorCode.EVENT_INVALID


class InsufficientAvailable(BusinessRefusal):
    """A payout above the merchant's available funds (balance less held and pending): a 402."""

    code: ClassVar[StrEnum] = PaymentErrorCode.INSUFFICIENT_AVAILABLE


class AssetNotPayable(InvalidState):
    """Merchants are paid out only in the assets the tenant marks payable (its currencies)."""

    code: ClassVar[StrEnum] = PaymentErrorCode.ASSET_NOT_PAYABLE


class BankAccountMissing(InvalidState):
    """No bank account is attached to the merchant: nowhere to pay out to."""

    code: ClassVar[StrEnum] = PaymentErrorCode.BANK_ACCOUNT_MISSING


class PayoutsHeld(NotPermitted):
    """Staff hold this merchant's payouts until they release them."""

    code: ClassVar[StrEnum] = PaymentErrorCode.PAYOUTS_HELD


class PayoutNotCancelable(InvalidState):
    """Only a payout the PSP has never been asked to make can be canceled."""

    code: ClassVar[StrEnum] = PaymentErrorCode.PAYOUT_NOT_CANCELABLE
