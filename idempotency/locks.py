"""Row locks of the idempotency engine (order: wallets/locks.py). A fenced completion locks
its record first, before the rows its effect takes; a mode switch takes a tenant row alone."""

from __future__ import annotations

from idempotency.models import IdempotencyRecord, RecordState
from tenants.models import Tenant


def idempotency_record_fence_lock(*, record_id: int, fence: int, in_flight: bool = False) -> bool:
    """Lock the record if `fence` is still current (and, with `in_flight`, it is still in flight); first, before the effect's rows."""
    record = IdempotencyRecord.objects.filter(id=record_id, fence=fence)
    if in_flight:
        record = record.filter(state=RecordState.IN_FLIGHT)
    return bool(record.order_by().select_for_update().values_list("id", flat=True))


def tenant_lock(*, tenant_id: int) -> Tenant:
    """A tenant's row (public schema, on every tenant's search_path): taken alone, by an idempotency mode switch."""
    locked: Tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
    return locked


def idempotency_records_lock(*, ids: list[int]) -> list[IdempotencyRecord]:
    """These records, in id order, locked (re-sealing their stored answers): taken alone,
    each waiting at most for the one transaction that holds its record."""
    return list(IdempotencyRecord.objects.filter(pk__in=ids).order_by("pk").select_for_update())
