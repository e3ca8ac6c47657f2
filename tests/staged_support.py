"""Helpers for the staged-migration tests: scratch tenants (committed, dropped after),
running the real command, and seeding data."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.core.management import call_command
from django.db import connection
from django_tenants.utils import schema_context

from tenants.models import Tenant
from tenants.services import tenant_create
from wallets.models import StagedMigrationState
from wallets.staged.phases import staged_phase_forget

LEGACY = ("customer_contacts", "merchant_daily_totals", "account_daily_totals")


@contextmanager
def scratch_tenants(count: int, prefix: str = "test_sm", legacy: tuple[str, ...] = LEGACY) -> Iterator[list[Tenant]]:
    """`count` fresh tenants (charging by customer id on), dropped afterwards. A new tenant
    starts some migrations contracted; those named in `legacy` are put back to `absent`,
    as in a tenant from before them (the default: the contacts' and daily totals' tests'
    starting point)."""
    tenants = []
    try:
        for _ in range(count):
            schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
            tenant = tenant_create(schema_name=schema, domain=f"{schema}.test.localhost", name=schema, main_currency="JPY")
            tenant.charge_by_customer_id = True
            tenant.save(update_fields=["charge_by_customer_id"])
            with schema_context(schema):
                StagedMigrationState.objects.filter(name__in=legacy).delete()
            staged_phase_forget()
            tenants.append(tenant)
        yield tenants
    finally:
        connection.set_schema_to_public()
        staged_phase_forget()
        for tenant in tenants:
            tenant.delete(force_drop=True)


@dataclass
class Run:
    code: int
    out: str
    err: str = ""
    lines: list[str] = field(default_factory=list)


def staged(*args: str, tenant: Tenant, **options: Any) -> Run:
    """Run `manage.py staged_migration *args --tenant <schema>` in this process."""
    out, err = io.StringIO(), io.StringIO()
    previous = connection.schema_name
    code = 0
    try:
        call_command("staged_migration", *args, tenant=tenant.schema_name, stdout=out, stderr=err, no_progress=True, **options)
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        staged_phase_forget()
        if previous == "public":
            connection.set_schema_to_public()
    return Run(code=code, out=out.getvalue(), err=err.getvalue())


def db_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE="config.settings.test", TALLY_TEST_DB_NAME=str(connection.settings_dict["NAME"]), **extra)
    return env
