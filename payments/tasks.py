"""Recovery of card top-ups (payments/services/topup_saga.py): beat tasks in the public
schema fan out one task per tenant (tenant-schemas-celery carries the schema), each one
service call. Every 10 s only the tenants whose recovery work is due (tenants.duework);
every 30 minutes (TALLY_SAFETY_SWEEP_SECONDS) all of them, the safety sweep (it also
purges old PSP event markers and refreshes the top-up gauges).

Switched-off tenants included: their PSP webhooks still land, and a charge taken for one
of their top-ups is settled or given back to the card whatever became of the operator."""

from __future__ import annotations

from celery import shared_task
from tenant_schemas_celery.task import TenantTask

from payments.services.topup_saga import topup_recovery_run
from tenants.duework import due_work_schemas
from tenants.models import DueWorkKind
from tenants.selectors import tenant_schemas_all
from tenants.services import task_send_in_each


@shared_task(base=TenantTask, name="payments.topups_recover_due_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_due_tenants() -> int:
    """Beat entry point, every 10 s: enqueue `topups_recover_tenant` in each tenant, switched
    on or off, whose recovery work is due (one query of the public table)."""
    return task_send_in_each(topups_recover_tenant, schemas=due_work_schemas(kinds=[DueWorkKind.TOPUPS], switched_off_too=True))


@shared_task(base=TenantTask, name="payments.topups_recover_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_all_tenants() -> int:
    """Beat's safety sweep, every TALLY_SAFETY_SWEEP_SECONDS: enqueue
    `topups_recover_tenant` inside every tenant, switched on or off."""
    return task_send_in_each(topups_recover_tenant, schemas=tenant_schemas_all())


@shared_task(base=TenantTask, name="payments.topups_recover_tenant", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_tenant() -> dict[str, int]:
    """Runs in one tenant's schema: take over orphaned top-ups, ask the PSP, converge."""
    return topup_recovery_run()
