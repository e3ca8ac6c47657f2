"""The outbox relay's Celery tasks (SPEC 8). Kicked after each commit that wrote an event
(payments.services.outbox sends "webhooks.outbox_relay" by name with the tenant schema),
and swept by beat every few seconds per tenant, which catches any kick that was lost."""

from __future__ import annotations

import time

from celery import current_app, shared_task
from django.conf import settings
from django.utils import timezone
from django_tenants.utils import schema_context
from tenant_schemas_celery.task import TenantTask

from tenants.selectors import tenant_schemas_active
from webhooks.selectors import webhook_deliveries_due_exist
from webhooks.services.relay import outbox_relay_run


@shared_task(base=TenantTask, name="webhooks.outbox_relay", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def webhooks_outbox_relay(kick_token: str = "") -> int:
    """Runs in one tenant's schema: publish due outbox events, send due deliveries.
    `kick_token`: set when a commit's kick sent this task (payments.services.outbox).

    A run that spent its dispatch budget with deliveries still due queues another run of
    this tenant behind whatever waits in the queue, and frees its worker process: a tenant
    with a huge backlog takes turns with the others instead of holding the workers."""
    started = time.monotonic()
    published = outbox_relay_run(kick_token=kick_token)
    spent = time.monotonic() - started >= float(settings.TALLY_WEBHOOK_DISPATCH_SECONDS)
    if spent and not current_app.conf.task_always_eager and webhook_deliveries_due_exist(now=timezone.now()):
        webhooks_outbox_relay.delay()  # tenant-schemas-celery sends this schema with it
    return published


@shared_task(base=TenantTask, name="webhooks.relay_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def webhooks_relay_all_tenants() -> int:
    """Beat entry point: enqueue `webhooks_outbox_relay` inside every active tenant."""
    schemas = tenant_schemas_active()
    for schema_name in schemas:
        with schema_context(schema_name):
            webhooks_outbox_relay.delay()
    return len(schemas)
