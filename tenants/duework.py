"""Which tenants have due work: a row per (tenant, kind) in the public table `DueWork`, so
the 10 s beat tasks enqueue work for the tenants that have some instead of visiting them all.

- **Mark** (`due_work_mark`): the transaction that makes work due (an outbox event, a
  pending card top-up) inserts its tenant's row in that same transaction, or does nothing
  when the row is there. On the hot path that is one statement that writes nothing while
  the row exists: `INSERT ... ON CONFLICT DO NOTHING` never locks the existing row, so the
  payments of one tenant never queue behind each other on it.
- **Settle** (`due_work_settle`): a worker that has done a tenant's work reads what is
  still due and deletes the row (nothing left) or moves its `due_at` (the next retry).
- **The race between them**: a commit that found the row and wrote nothing, while a
  worker, which cannot see that uncommitted work yet, deletes the row. Both hold one
  advisory lock per (tenant, concern), taken in the transaction: a marking writer in
  SHARED mode (writers never wait for each other), a settling worker in EXCLUSIVE mode,
  only tried. A settle that cannot take it leaves the row as it is (a writer is in flight:
  there is work); one that takes it knows every writer that saw the row has committed, so
  its reads, which start after the lock, see their work. A writer that comes while a settle
  holds it waits for that short transaction; its insert then finds the row gone and writes
  it again. The marking INSERT takes the lock in its own row source, so the row's presence
  is checked after the lock is held (a separate SELECT taken before it could read a row
  the settle deletes next).
- **The safety sweep**: every tenant is still visited, every 10 minutes, by the old
  fan-outs (settings.CELERY_BEAT_SCHEDULE), so work whose row went missing (a bug, a row
  deleted by hand) waits at most that long, never for ever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from tenants.models import DueWork, DueWorkKind

# Kinds that share one lock: the relay's "now" row and its "later" row are settled together.
_LOCK_GROUP = {DueWorkKind.RELAY: "relay", DueWorkKind.RELAY_LATER: "relay", DueWorkKind.TOPUPS: "topups"}


def _schema() -> str:
    return str(getattr(connection, "schema_name", "public"))


def _lock_name(*, schema_name: str, kind: str) -> str:
    return f"tally.duework:{schema_name}:{_LOCK_GROUP[DueWorkKind(kind)]}"


def due_work_mark(*, kind: DueWorkKind, due_at: datetime) -> None:
    """Record in the caller's transaction (or at once, outside one) that the current
    tenant has work of `kind` due at `due_at`. A row already there is left alone, so the
    caller's `due_at` must not be earlier than any the row can hold (the relay's "now" row
    is only ever now; a top-up's lease end is later than any earlier top-up's).

    Locks: the (tenant, concern) advisory lock, SHARED, until the transaction ends."""
    schema_name = _schema()
    if schema_name in ("public", str(settings.TENANT_BASE_SCHEMA)):
        return  # no tenant: nothing a beat task could be sent to
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {DueWork._meta.db_table} (tenant_id, kind, due_at)"  # noqa: S608 - the model's table name
            " SELECT %s, %s, %s FROM (SELECT pg_advisory_xact_lock_shared(hashtext(%s))) AS held"
            " ON CONFLICT (tenant_id, kind) DO NOTHING",
            [schema_name, str(kind), due_at, _lock_name(schema_name=schema_name, kind=kind)],
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
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [_lock_name(schema_name=schema_name, kind=kind)])
        row = cursor.fetchone()
        if not (row and row[0]):
            return False
        due = next_due()
        now = timezone.now()
        kinds = [kind, *([later_kind] if later_kind else [])]
        keep = None if due is None else (later_kind if later_kind and due > now else kind)
        DueWork.objects.filter(tenant_id=schema_name, kind__in=[k for k in kinds if k != keep]).delete()
        if keep is not None and due is not None:
            DueWork.objects.bulk_create(
                [DueWork(tenant_id=schema_name, kind=keep, due_at=due)],
                update_conflicts=True, unique_fields=["tenant", "kind"], update_fields=["due_at"],
            )
    return True


def due_work_schemas(*, kinds: Iterable[DueWorkKind], now: datetime | None = None) -> list[str]:
    """The active tenants with work of one of `kinds` due by `now`, in one query."""
    due = DueWork.objects.filter(kind__in=[str(k) for k in kinds], due_at__lte=now or timezone.now(), tenant__is_active=True)
    return [str(s) for s in due.order_by("tenant_id").values_list("tenant_id", flat=True).distinct()]
