"""The outbox relay's Celery tasks (SPEC 8): kicked after a commit, swept by beat (docs/WEBHOOKS.md
"Kick" and "Sweep"). Queues: settings.CELERY_TASK_ROUTES."""

from __future__ import annotations

import time

from celery import current_app, shared_task
from django.conf import settings
from django.utils import timezone
from tenant_schemas_celery.task import TenantTask

from tenants.duework import due_work_schemas
from tenants.models import DueWorkKind
from tenants.selectors import tenant_schemas_active
from tenants.services import task_send_in_each
from webhooks.selectors import webhook_deliveries_due_exist
from webhooks.services.relay import outbox_relay_run


def _relay(*, kick_token: str, settle: bool) -> int:
    """A run that spent its dispatch budget with deliveries still due queues another run of its
    tenant at the back of the queue: a huge backlog takes turns instead of holding the workers."""
    started = time.monotonic()
    published = outbox_relay_run(kick_token=kick_token, settle=settle)
    spent = time.monotonic() - started >= float(settings.TALLY_WEBHOOK_DISPATCH_SECONDS)
    if spent and not current_app.conf.task_always_eager and webhook_deliveries_due_exist(now=timezone.now()):
        webhooks_outbox_relay.delay()  # tenant-schemas-celery sends this schema with it
    return published


@shared_task(base=TenantTask, name="webhooks.outbox_relay", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def webhooks_outbox_relay(kick_token: str = "") -> int:
    """Runs in one tenant's schema: publish due outbox events, send due deliveries.
    `kick_token`: set when a commit's kick sent this task (payments.services.outbox)."""
    return _relay(kick_token=kick_token, settle=False)


@shared_task(base=TenantTask, name="webhooks.relay_scheduled", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def webhooks_relay_scheduled() -> int:
    """Runs in one tenant's schema, sent by beat: the relay, then its due-work row settled."""
    return _relay(kick_token="", settle=True)


@shared_task(base=TenantTask, name="webhooks.relay_due_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def webhooks_relay_due_tenants() -> int:
    """Beat entry point, every 10 s: enqueue `webhooks_relay_scheduled` in each tenant whose
    relay work is due (one query of the public table)."""
    return task_send_in_each(webhooks_relay_scheduled, schemas=due_work_schemas(kinds=[DueWorkKind.RELAY, DueWorkKind.RELAY_LATER]))


@shared_task(base=TenantTask, name="webhooks.relay_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def webhooks_relay_all_tenants() -> int:
    """Beat's safety sweep, every TALLY_SAFETY_SWEEP_SECONDS: `webhooks_relay_scheduled` in
    every active tenant, so work whose due-work row went missing waits at most that long."""
    return task_send_in_each(webhooks_relay_scheduled, schemas=tenant_schemas_active())
