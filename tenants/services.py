"""Write services for tenants (public schema), and beat's per-tenant fan-out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django_tenants.utils import schema_context, schema_exists

from tenants.models import Domain, Tenant
from tenants.schemas import clone_session_renew, schemas_missing_migrations
from tenants.signals import tenant_created

TEMPLATE_SCHEMA = settings.TENANT_BASE_SCHEMA


def tenant_template_ensure() -> Tenant:
    """Make sure the template schema new tenants are cloned from exists and holds every
    migration on disk. It is an inactive tenant row, so `migrate_schemas` keeps it migrated;
    missing migrations run here, outside any transaction (one may build indexes concurrently)."""
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    template: Tenant | None = Tenant.objects.filter(schema_name=TEMPLATE_SCHEMA).first()
    if template is None:
        template = Tenant(schema_name=TEMPLATE_SCHEMA, name="Template (not a tenant)", main_currency="XXX", is_active=False)
        template.save()  # no clone source yet: runs the tenant migrations
    elif not schema_exists(TEMPLATE_SCHEMA):
        template.create_schema(check_if_exists=True, verbosity=0)
    elif schemas_missing_migrations(schemas=[TEMPLATE_SCHEMA])[TEMPLATE_SCHEMA]:
        call_command("migrate_schemas", tenant=True, schema_name=TEMPLATE_SCHEMA, interactive=False, verbosity=0)
        connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    return template


def tenant_creation_prepare() -> None:
    """What creating a tenant needs before its transaction opens: the template migrated and,
    outside any transaction, a new database session for the clone (`clone_session_renew`)."""
    tenant_template_ensure()
    clone_session_renew()


def tenant_create(*, schema_name: str, domain: str, name: str, main_currency: str, currency_exponent: int = 0) -> Tenant:
    """Create a tenant: schema (cloned from the template) and domain; then `tenant_setup`."""
    tenant_creation_prepare()
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    with transaction.atomic():
        tenant = Tenant(schema_name=schema_name, name=name, main_currency=main_currency, currency_exponent=currency_exponent)
        tenant.full_clean(exclude=["schema_name"])
        tenant.save(verbosity=0)
        Domain.objects.create(tenant=tenant, domain=domain, is_primary=True)
    tenant_setup(tenant=tenant)
    return tenant


def tenant_setup(*, tenant: Tenant) -> None:
    """Inside a new tenant's schema, `tenant_created` lets the apps above set up their part
    (wallets: assets and system accounts). The platform admin, which saves the tenant, calls it too."""
    with schema_context(tenant.schema_name):
        tenant_created.send(sender=Tenant, tenant=tenant)


def task_send_in_each(task: Any, *, schemas: Sequence[str]) -> int:
    """Send `task` (no arguments) once inside each of `schemas` (tenant-schemas-celery carries
    the schema with the message); returns how many."""
    for schema_name in schemas:
        with schema_context(schema_name):
            task.delay()
    return len(schemas)
