"""What every reconciliation check reads and yields (the contract: docs/ARCHITECTURE.md, "a new reconciliation check")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import connection


class Severity(StrEnum):
    CRITICAL = "critical"  # money is wrong somewhere: stop and look
    WARNING = "warning"  # something to act on (a suspect, a stuck key, a dead letter)


@dataclass(frozen=True)
class ObjectRef:
    """A row a finding concerns: rendered as an admin link when the model has an admin page."""

    app_label: str
    model: str
    pk: str


@dataclass(frozen=True)
class Discrepancy:
    kind: str
    severity: Severity
    summary: str
    details: dict[str, Any]
    refs: tuple[ObjectRef, ...] = ()


@dataclass
class CheckContext:
    """What a check may read: the run's clock and limits, and `stats` for the report (rows scanned...)."""

    now: datetime
    chunk_size: int = 2000
    duplicate_window_seconds: int = 300
    outbox_lag_threshold_seconds: int = 300
    # Days (UTC, today included) the PSP settlement and the merchant daily totals checks compare.
    settlement_days: int = 2
    daily_totals_days: int = 2
    # How long the top-up recovery may take to give back a charge it could not credit, before it is a finding.
    topup_recovery_window_seconds: int = 3600
    # How long a payout may wait in the operator queue, or owe its money back (the PSP not answering), before it is a finding.
    payout_review_warn_seconds: int = 86400
    payout_return_warn_seconds: int = 3600
    # Merchants whose balance at the PSP one run reads (a PSP call each), the next run going on after the last.
    payout_destinations_per_run: int = field(default_factory=lambda: int(settings.TALLY_RECONCILIATION_PAYOUT_DESTINATIONS))
    stats: dict[str, Any] = field(default_factory=dict)
    # The outbox backlog (count, oldest age in seconds), read once for the outbox check and the run's metrics.
    outbox_backlog: tuple[int, float] | None = None


def rows_stream(sql: str, params: list[Any] | None = None, *, chunk_size: int) -> Iterator[tuple[Any, ...]]:
    """The rows of one read statement through a server-side cursor, `chunk_size` at a time."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params or [])
        while rows := cursor.fetchmany(chunk_size):
            yield from rows
