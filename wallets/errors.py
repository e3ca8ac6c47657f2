"""The domain's typed failures: a `code` (also its wire name), a message, and the offending
request field in `param`. None knows about HTTP: apikit/errors.py maps each family to a
status. Apps above this one subclass these families with codes of their own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    AMOUNT_INVALID = "amount_invalid"
    ASSET_UNKNOWN = "asset_unknown"
    RESOURCE_MISSING = "resource_missing"
    INSUFFICIENT_FUNDS = "insufficient_funds"
    CAP_EXCEEDED = "cap_exceeded"
    WALLET_FROZEN = "wallet_frozen"
    INVALID_STATE = "invalid_state"
    PERMISSION_DENIED = "permission_denied"
    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"


class TallyError(Exception):
    """Base of every domain failure. `retryable` failures may succeed if sent again
    unchanged (contention, an unreachable store); `retry_after_seconds` says when."""

    code: ClassVar[StrEnum] = ErrorCode.INVALID_REQUEST
    retryable: bool = False
    retry_after_seconds: int = 1

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(TallyError):
    """The request is wrong as sent: fixing it is the caller's job."""


class AmountInvalid(InvalidRequest):
    code: ClassVar[StrEnum] = ErrorCode.AMOUNT_INVALID

    def __init__(self, message: str = "amount must be a positive integer in the asset's minor unit", *, param: str | None = "amount") -> None:
        super().__init__(message, param=param)


class AssetUnknown(InvalidRequest):
    code: ClassVar[StrEnum] = ErrorCode.ASSET_UNKNOWN

    def __init__(self, message: str = "unknown asset", *, param: str | None = "asset") -> None:
        super().__init__(message, param=param)


class NotFound(TallyError):
    """No such object, or not one the caller may see: the two are indistinguishable (SPEC 4)."""

    code: ClassVar[StrEnum] = ErrorCode.RESOURCE_MISSING


class BusinessRefusal(TallyError):
    """Refused after execution began (SPEC 5: stored and replayed like a success)."""


class InsufficientFunds(BusinessRefusal):
    code: ClassVar[StrEnum] = ErrorCode.INSUFFICIENT_FUNDS


class CapExceeded(BusinessRefusal):
    code: ClassVar[StrEnum] = ErrorCode.CAP_EXCEEDED


class WalletFrozen(BusinessRefusal):
    code: ClassVar[StrEnum] = ErrorCode.WALLET_FROZEN


class NotPermitted(TallyError):
    """The caller is who it says, but may not do this (to this object)."""

    code: ClassVar[StrEnum] = ErrorCode.PERMISSION_DENIED


class InvalidState(TallyError):
    """The object is not in a state that allows this (e.g. a revoked key rotated)."""

    code: ClassVar[StrEnum] = ErrorCode.INVALID_STATE


class Conflict(TallyError):
    """Serialization failure, deadlock or lock timeout that outlived the retries."""

    code: ClassVar[StrEnum] = ErrorCode.CONFLICT
    retryable = True


class Unavailable(TallyError):
    """The database (or another store we must not guess without) is unreachable."""

    code: ClassVar[StrEnum] = ErrorCode.UNAVAILABLE
    retryable = True
