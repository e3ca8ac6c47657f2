"""Recovery of card top-ups (payments/services/topup_saga.py): a beat task in the public
schema fans out one task per tenant (tenant-schemas-celery carries the schema), each one
service call."""

from __future__ import annotations

from celery import shared_task
from django_tenants.utils import schema_context
from tenant_schemas_celery.task import TenantTask

from payments.services.topup_saga import topup_recovery_run
from tenants.selectors import tenant_schemas_active


@shared_task(base=TenantTask, name="payments.topups_recover_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_all_tenants() -> int:
    """Beat entry point: enqueue `topups_recover_tenant` inside every active tenant."""
    schemas = tenant_schemas_active()
    for schema_name in schemas:
        with schema_context(schema_name):
            topups_recover_tenant.delay()
    return len(schemas)


@shared_task(base=TenantTask, name="payments.topups_recover_tenant", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_tenant() -> dict[str, int]:
    """Runs in one tenant's schema: take over orphaned top-ups, ask the PSP, converge."""
    return topup_recovery_run()
