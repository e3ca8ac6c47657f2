"""What a staged data migration implements, the helpers its phases share, and the registry
the command looks in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet


class StagedMigrationRefused(Exception):
    """A phase cannot run now (wrong phase, a precondition unmet); the message says why."""


@dataclass(frozen=True)
class BatchResult:
    """One backfill batch: where the next one starts (None: done), rows seen and written."""

    cursor: str | None
    rows_seen: int
    rows_written: int


@dataclass
class VerifyReport:
    """Counts and checksums of both sides, and every difference (identifiers, never values)."""

    counts: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def as_json(self) -> dict[str, Any]:
        return {"counts": self.counts, "checksums": self.checksums, "differences": self.differences[:100], "difference_count": len(self.differences)}


class StagedMigration(ABC):
    """A migration of some data to a new representation, in the tenant's schema; the owning
    app's services and selectors ask wallets.staged.phases which to write and read."""

    name: str = ""
    description: str = ""
    # True when the old representation is still there after contract (verify keeps working).
    old_survives_contract: bool = False
    # Rows per backfill batch (one transaction) when the command is not told.
    default_batch: int = 500

    def expand(self) -> None:
        """Make sure the new representation exists (else raise StagedMigrationRefused)."""
        return None

    @abstractmethod
    def backfill_total(self) -> int:
        """How many rows (units of `backfill_batch`) there are, for the progress bar."""

    @abstractmethod
    def backfill_batch(self, *, after: str, limit: int, dry_run: bool) -> BatchResult:
        """Copy up to `limit` rows after `after` ("" = the start), in the runner's transaction,
        writing only what is absent or different; with `dry_run`, count what it would write."""

    @abstractmethod
    def verify(self) -> VerifyReport:
        """Compare both representations in one snapshot."""

    def contract(self) -> None:
        """Remove the old representation (idempotent: it may be re-run after a kill)."""
        return None

    def discard(self) -> None:
        """Rollback of expand: remove the data the new path wrote (idempotent)."""
        return None


@contextmanager
def verify_snapshot() -> Iterator[None]:
    """A REPEATABLE READ, read-only transaction: verify compares both sides at one moment."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def discard_in_batches(rows: QuerySet[Any], empty: Callable[[QuerySet[Any]], object], *, batch: int) -> None:
    """`empty` the next `batch` of `rows` (by pk), one short transaction each, until none is left."""
    while True:
        with transaction.atomic():
            ids = list(rows.order_by("pk").values_list("pk", flat=True)[:batch])
            if not ids:
                return
            empty(rows.model.objects.filter(pk__in=ids))


_registry: dict[str, StagedMigration] = {}


def staged_migration_register(migration: StagedMigration) -> None:
    if not migration.name:
        raise ValueError("a staged migration needs a name")
    _registry[migration.name] = migration


def staged_migrations() -> dict[str, StagedMigration]:
    return dict(sorted(_registry.items()))
