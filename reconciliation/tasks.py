"""Reconciliation's Celery tasks: beat fans out one run per tenant; each task is one service call."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import connection, transaction
from django_tenants.utils import schema_context
from tenant_schemas_celery.task import TenantTask

from reconciliation.models import RunTrigger
from reconciliation.registry import CHECKS
from reconciliation.services import RUN_TIME_LIMIT_SECONDS, reconciliation_run_execute, reconciliation_run_request
from tenants.selectors import tenant_schemas_active, tenant_schemas_all


@shared_task(  # type: ignore[untyped-decorator]  # celery is untyped
    base=TenantTask, name="reconciliation.run_tenant", ignore_result=True,
    # A run reads the whole ledger (6-9 s at 1M entries, docs/BENCHMARKS.md): its own limits,
    # not the relay's 120/180 s, and under the broker's visibility timeout (3600 s).
    soft_time_limit=RUN_TIME_LIMIT_SECONDS - 60, time_limit=RUN_TIME_LIMIT_SECONDS,
)
def reconciliation_run_tenant(*, run_id: int, check_names: list[str] | None = None) -> int:
    """Runs in one tenant's schema: execute one requested run (every check, or the named
    ones). Returns its findings count."""
    checks = None if check_names is None else [check for check in CHECKS if check.name in check_names]
    return int(reconciliation_run_execute(run_id=run_id, checks=checks).findings_count)


def reconciliation_run_enqueue_on_commit(*, run_id: int, check_names: list[str] | None = None) -> None:
    """After commit, send the run's task with the schema it was requested in."""
    schema_name = str(getattr(connection, "schema_name"))  # noqa: B009 - set by django-tenants
    kwargs: dict[str, Any] = {"run_id": run_id} if check_names is None else {"run_id": run_id, "check_names": check_names}

    def enqueue() -> None:
        with schema_context(schema_name):
            reconciliation_run_tenant.delay(**kwargs)

    transaction.on_commit(enqueue)


# What a switched-off tenant is still checked for: card charges neither credited nor given
# back, and the PSP's settlement (its webhooks and top-up recovery still run).
SWITCHED_OFF_CHECKS = ["psp_settlement"]


@shared_task(base=TenantTask, name="reconciliation.run_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def reconciliation_run_all_tenants() -> int:
    """Beat entry point (django-celery-beat PeriodicTask, see reconciliation_schedule_ensure):
    request a run in every tenant and enqueue it after commit: every check in an active
    tenant, the PSP settlement check alone in a switched-off one."""
    active = set(tenant_schemas_active())
    schemas = tenant_schemas_all()
    for schema_name in schemas:
        check_names = None if schema_name in active else SWITCHED_OFF_CHECKS
        with schema_context(schema_name), transaction.atomic():
            run = reconciliation_run_request(trigger=RunTrigger.BEAT)
            reconciliation_run_enqueue_on_commit(run_id=run.pk, check_names=check_names)
    return len(schemas)
