"""One transaction per service call, with bounded retry of conflicts (SPEC 3).

Only conflicts are retried (serialization failure, deadlock, lock timeout): at most 3
times, 50 ms x 2^n with jitter, each counted, and only by the owner of the outermost
transaction; inside an atomic block a conflict propagates.

Nested calls get no savepoint (no round trips for it on the keyed API path), so a
caller must never catch a service's exception inside an atomic block and carry on: some
services write before they refuse, and only the owner's rollback undoes that.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from wallets import metrics
from wallets.errors import Conflict, Unavailable

T = TypeVar("T")
P = ParamSpec("P")

MAX_RETRIES = 3
BASE_DELAY_SECONDS = 0.05
CONFLICT_SQLSTATES = {"40001": "serialization_failure", "40P01": "deadlock", "55P03": "lock_timeout"}


def sqlstate_of(exc: BaseException) -> str | None:
    cause: BaseException | None = exc
    while cause is not None:
        state = getattr(cause, "sqlstate", None)
        if state:
            return str(state)
        cause = cause.__cause__
    return None


def is_connection_failure(exc: BaseException) -> bool:
    state = sqlstate_of(exc)
    if isinstance(exc, InterfaceError):
        return True
    return isinstance(exc, OperationalError) and (state is None or state.startswith("08") or state == "57P01")


def run_atomic(fn: Callable[[], T], *, operation: str) -> T:
    """Run `fn` in one database transaction, retrying it whole on a conflict; inside an
    enclosing atomic block just run it (the block's owner retries)."""
    if connection.in_atomic_block:
        return fn()
    attempt = 0
    while True:
        try:
            with transaction.atomic():
                return fn()
        except DatabaseError as exc:
            state = sqlstate_of(exc)
            if state in CONFLICT_SQLSTATES:
                if attempt >= MAX_RETRIES:
                    raise Conflict(f"{operation}: too much contention, retry later") from exc
                metrics.TRANSACTION_CONFLICT_RETRIES.labels(operation=operation, reason=CONFLICT_SQLSTATES[state]).inc()
                time.sleep(BASE_DELAY_SECONDS * (2**attempt) * random.uniform(0.5, 1.5))
                attempt += 1
                continue
            if is_connection_failure(exc):
                metrics.FAIL_CLOSED.labels(store="postgres").inc()
                raise Unavailable("database unavailable") from exc
            raise


def atomic_service(*, operation: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorator form of `run_atomic`: the service body is one transaction, conflicts
    retried whole (the body must therefore have no effect outside the database)."""

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            return run_atomic(lambda: fn(*args, **kwargs), operation=operation)

        return wrapper

    return decorate

