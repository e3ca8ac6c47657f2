"""Typed failures of the payments service. The API maps each to the SPEC's error
envelope by its `status`, `code` and `param`; nothing else decides a status."""

from __future__ import annotations


class TallyError(Exception):
    status: int = 400
    error_type: str = "invalid_request_error"
    code: str = "invalid_request"
    retryable: bool = False

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class AmountInvalid(TallyError):
    code = "amount_invalid"

    def __init__(self, message: str = "amount must be a positive integer in the asset's minor unit", *, param: str | None = "amount") -> None:
        super().__init__(message, param=param)


class AssetUnknown(TallyError):
    code = "asset_unknown"

    def __init__(self, message: str = "unknown asset", *, param: str | None = "asset") -> None:
        super().__init__(message, param=param)


class NotFound(TallyError):
    status = 404
    code = "resource_missing"


class BusinessRefusal(TallyError):
    """Refused after execution began (SPEC 5: 402, stored and replayed)."""

    status = 402
    error_type = "payment_error"


class InsufficientFunds(BusinessRefusal):
    code = "insufficient_funds"


class CapExceeded(BusinessRefusal):
    code = "cap_exceeded"


class WalletFrozen(BusinessRefusal):
    code = "wallet_frozen"


class InvalidState(TallyError):
    """A state conflict, e.g. an intent that is no longer editable."""

    status = 409
    code = "invalid_state"


class RefundWindowClosed(TallyError):
    """Terminals refund only what they took today (SPEC 4): older refunds go through the
    merchant's back office, where someone accountable decides."""

    status = 409
    code = "refund_window_closed"


class Conflict(TallyError):
    """Serialization failure, deadlock or lock timeout that outlived the retries."""

    status = 409
    error_type = "api_error"
    code = "conflict"
    retryable = True


class Unavailable(TallyError):
    """The database (or another store we must not guess without) is unreachable."""

    status = 503
    error_type = "api_error"
    code = "unavailable"
    retryable = True
