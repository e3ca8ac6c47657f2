"""Typed answers of the idempotency layer. They are `TallyError`s, so the faces' one
exception handler renders them in the SPEC envelope; `headers` (e.g. Retry-After) are
copied onto the response."""

from __future__ import annotations

from payments.errors import TallyError

KEY_PARAM = "Idempotency-Key"


class IdempotencyError(TallyError):
    error_type = "idempotency_error"
    headers: dict[str, str]

    def __init__(self, message: str, *, param: str | None = KEY_PARAM, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, param=param)
        self.headers = dict(headers or {})


class IdempotencyKeyMissing(IdempotencyError):
    status = 400
    error_type = "invalid_request_error"
    code = "idempotency_key_missing"


class IdempotencyKeyInvalid(IdempotencyError):
    status = 400
    error_type = "invalid_request_error"
    code = "idempotency_key_invalid"


class IdempotencyKeyInUse(IdempotencyError):
    """The same key is still being executed by another request after our bounded wait."""

    status = 409
    code = "idempotency_key_in_use"
    retryable = True

    def __init__(self, message: str = "a request with this Idempotency-Key is still in progress; retry later", *, retry_after: int = 1) -> None:
        self.retry_after = max(1, retry_after)
        super().__init__(message, headers={"Retry-After": str(self.retry_after)})


class IdempotencyKeyExpired(IdempotencyError):
    status = 410
    code = "idempotency_key_expired"

    def __init__(self, message: str = "this Idempotency-Key is past its replay window; use a new key") -> None:
        super().__init__(message)


class IdempotencyKeyReused(IdempotencyError):
    status = 422
    code = "idempotency_key_reused"

    def __init__(self, message: str = "this Idempotency-Key was used with a different request") -> None:
        super().__init__(message)


class StaleFence(Exception):
    """A writer's fence is no longer current: its lease was taken over. It must change nothing."""
