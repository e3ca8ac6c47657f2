"""Transactions with bounded retry of conflicts (SPEC 3).

Only conflicts are retried: serialization failure (40001), deadlock (40P01) and lock
timeout (55P03); at most 3 retries, 50 ms x 2^n with jitter, each counted. Retrying is
the job of whoever owns the outermost transaction: inside an enclosing atomic block a
conflict propagates (the block is aborted; only its owner can start it again).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from config import metrics
from payments.errors import Conflict, Unavailable

T = TypeVar("T")

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
    """Run `fn` in one database transaction, retrying it whole on a conflict."""
    if connection.in_atomic_block:
        return fn()

    def in_transaction() -> T:
        with transaction.atomic():
            return fn()

    return _retrying_conflicts(in_transaction, operation=operation)


def run_single_statement(fn: Callable[[], T], *, operation: str) -> T:
    """Run `fn`, which sends exactly ONE SQL statement, with the conflict retry of
    `run_atomic` but without BEGIN/COMMIT when no transaction encloses it.

    PostgreSQL runs a lone statement atomically (autocommit), so the transaction would
    only add two round trips. Inside an enclosing atomic block (the idempotency layer's)
    the statement joins that transaction and conflicts propagate to its owner.
    """
    if connection.in_atomic_block:
        return fn()
    return _retrying_conflicts(fn, operation=operation)


def _retrying_conflicts(attempt_fn: Callable[[], T], *, operation: str) -> T:
    attempt = 0
    while True:
        try:
            return attempt_fn()
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
