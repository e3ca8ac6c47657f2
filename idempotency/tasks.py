"""Retention of idempotency records (SPEC 6): a beat task in the public schema fans out one
task per tenant (tenant-schemas-celery carries the schema), each one service call."""

from __future__ import annotations

from celery import shared_task
from tenant_schemas_celery.task import TenantTask

from idempotency.engine import idempotency_maintenance_run
from tenants.selectors import tenant_schemas_active
from tenants.services import task_send_in_each


@shared_task(base=TenantTask, name="idempotency.purge_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def idempotency_purge_all_tenants() -> int:
    return task_send_in_each(idempotency_purge_tenant, schemas=tenant_schemas_active())


@shared_task(base=TenantTask, name="idempotency.purge_tenant", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def idempotency_purge_tenant() -> int:
    return idempotency_maintenance_run()
