"""Recovery of card top-ups (payments/services/topup_saga.py), fanned out per tenant by beat
(docs/ARCHITECTURE.md, "Beat, due work"). Switched-off tenants included: their PSP webhooks
still land, and a charge taken for one of their top-ups is settled or given back."""

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
    """Beat, every 10 s: `topups_recover_tenant` in each tenant whose recovery work is due."""
    return task_send_in_each(topups_recover_tenant, schemas=due_work_schemas(kinds=[DueWorkKind.TOPUPS], switched_off_too=True))


@shared_task(base=TenantTask, name="payments.topups_recover_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_all_tenants() -> int:
    """Beat's safety sweep, every TALLY_SAFETY_SWEEP_SECONDS: `topups_recover_tenant` in every tenant."""
    return task_send_in_each(topups_recover_tenant, schemas=tenant_schemas_all())


@shared_task(base=TenantTask, name="payments.topups_recover_tenant", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_tenant() -> dict[str, int]:
    """Runs in one tenant's schema: take over orphaned top-ups, ask the PSP, converge."""
    return topup_recovery_run()
