"""Which tenants have due work: rows per (tenant, kind) in the public table `DueWork`, so
the 10 s beat tasks enqueue work for the tenants that have some instead of visiting them all.

How writers mark and workers settle, and why the table has no unique key: docs/ARCHITECTURE.md
"Beat, due work and the Celery queues". A settle must not delete the row under a commit that
found it and wrote nothing: one advisory lock per (tenant, concern), SHARED for a marking
writer, EXCLUSIVE and only tried for a settle, which then reads after every such commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from tenants.models import DueWork, DueWorkKind

# How long a settle's reads may run while its tenant's marking writers wait for it.
SETTLE_STATEMENT_TIMEOUT = "500ms"

# The due-work locks' own key space: PostgreSQL's two-int advisory keys never meet the one-bigint
# keys of wallets.locks.advisory_lock_try (a tenant's whole recovery pass), so a 32-bit hash
# collision between two tenants' names cannot make one's payments wait for the other's pass.
LOCK_SPACE = 0x64756577  # "duew"

# Kinds that share one lock: the relay's "now" row and its "later" row are settled together.
_LOCK_GROUP = {DueWorkKind.RELAY: "relay", DueWorkKind.RELAY_LATER: "relay", DueWorkKind.TOPUPS: "topups"}


def _schema() -> str:
    return str(getattr(connection, "schema_name", "public"))


def _lock_name(*, schema_name: str, kind: str) -> str:
    return f"tally.duework:{schema_name}:{_LOCK_GROUP[DueWorkKind(kind)]}"


def due_work_mark(*, kind: DueWorkKind, due_at: datetime) -> None:
    """Record in the caller's transaction (or at once, outside one) that the current
    tenant has work of `kind` due at `due_at`. A row already there is left alone, so work
    marked earlier than that row's `due_at` waits for it: the relay's "now" row is only
    ever now, and a top-up row is due by the end of a lease at the latest.

    Locks: the (tenant, concern) advisory lock, SHARED, until the transaction ends."""
    schema_name = _schema()
    if schema_name in ("public", str(settings.TENANT_BASE_SCHEMA)):
        return  # no tenant: nothing a beat task could be sent to
    table = DueWork._meta.db_table
    with connection.cursor() as cursor:
        # Two statements: the second's snapshot is taken once the lock is held, so it sees
        # the deletion of a settle that held the lock before us. (In one statement the
        # snapshot predates the lock, and PostgreSQL may test NOT EXISTS before the lock.)
        cursor.execute("SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))", [LOCK_SPACE, _lock_name(schema_name=schema_name, kind=kind)])
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, kind, due_at) SELECT %s, %s, %s"  # noqa: S608 - the model's table name
            f" WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE tenant_id = %s AND kind = %s)",
            [schema_name, str(kind), due_at, schema_name, str(kind)],
        )


def due_work_settle(
    *, kind: DueWorkKind, next_due: Callable[[], datetime | None], later_kind: DueWorkKind | None = None
) -> bool:
    """After a worker did the current tenant's work of `kind`: read when work is next due
    (`next_due`, called once the lock is held) and make the rows say so. Nothing due: the
    rows go. Due now or earlier: the `kind` row. Due later: the `later_kind` row if the
    concern has one (its writers mark `kind` for now and must not find a later row), else
    the `kind` row. Returns False, changing nothing, when a writer of the tenant is in
    flight (the lock is taken): that writer's row stays, and the next visit settles.

    Locks: the (tenant, concern) advisory lock, EXCLUSIVE, tried, for one short transaction."""
    schema_name = _schema()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", [LOCK_SPACE, _lock_name(schema_name=schema_name, kind=kind)])
            row = cursor.fetchone()
            if not (row and row[0]):
                return False
            # While the lock is held, the tenant's marking writers wait: the reads get a short budget, and
            # a settle that overruns it gives up (the lock and this setting go with its transaction).
            cursor.execute(
                "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)", [SETTLE_STATEMENT_TIMEOUT]
            )
            (outside, _) = cursor.fetchone()
            due = next_due()
            now = timezone.now()
            kinds = [kind, *([later_kind] if later_kind else [])]
            keep = None if due is None else (later_kind if later_kind and due > now else kind)
            DueWork.objects.filter(tenant_id=schema_name, kind__in=kinds).delete()
            if keep is not None and due is not None:
                DueWork.objects.create(tenant_id=schema_name, kind=keep, due_at=due)
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [outside])
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "57014":  # query_canceled: our timeout
            raise
        return False  # rolled back, the rows as they were: the next visit settles
    return True


def due_work_schemas(*, kinds: Iterable[DueWorkKind], now: datetime | None = None, switched_off_too: bool = False) -> list[str]:
    """The active tenants (`switched_off_too`: every tenant) with work of one of `kinds`
    due by `now`, in one query."""
    due = DueWork.objects.filter(kind__in=[str(k) for k in kinds], due_at__lte=now or timezone.now())
    if not switched_off_too:
        due = due.filter(tenant__is_active=True)
    return [str(s) for s in due.order_by("tenant_id").values_list("tenant_id", flat=True).distinct()]
