"""Typed answers of the idempotency layer. Domain errors like every other: a code from
`IdempotencyErrorCode`, no HTTP; the API's one exception handler maps them (SPEC 5)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import InvalidRequest, TallyError

KEY_PARAM = "Idempotency-Key"


class IdempotencyErrorCode(StrEnum):
    KEY_MISSING = "idempotency_key_missing"
    KEY_INVALID = "idempotency_key_invalid"
    KEY_IN_USE = "idempotency_key_in_use"
    KEY_EXPIRED = "idempotency_key_expired"
    KEY_REUSED = "idempotency_key_reused"


class IdempotencyError(TallyError):
    default_message: ClassVar[str] = ""

    def __init__(self, message: str | None = None, *, param: str | None = KEY_PARAM) -> None:
        super().__init__(self.default_message if message is None else message, param=param)


class IdempotencyKeyMissing(IdempotencyError, InvalidRequest):
    code: ClassVar[StrEnum] = IdempotencyErrorCode.KEY_MISSING


class IdempotencyKeyInvalid(IdempotencyError, InvalidRequest):
    code: ClassVar[StrEnum] = IdempotencyErrorCode.KEY_INVALID


class IdempotencyKeyInUse(IdempotencyError):
    """The same key is still being executed by another request after our bounded wait."""

    code: ClassVar[StrEnum] = IdempotencyErrorCode.KEY_IN_USE
    default_message = "a request with this Idempotency-Key is still in progress; retry later"
    retryable = True

    def __init__(self, message: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = max(1, retry_after)


class IdempotencyKeyExpired(IdempotencyError):
    code: ClassVar[StrEnum] = IdempotencyErrorCode.KEY_EXPIRED
    default_message = "this Idempotency-Key is past its replay window; use a new key"


class IdempotencyKeyReused(IdempotencyError):
    code: ClassVar[StrEnum] = IdempotencyErrorCode.KEY_REUSED
    default_message = "this Idempotency-Key was used with a different request"


class StaleFence(Exception):
    """A writer's fence is no longer current: its lease was taken over. It must change nothing."""
