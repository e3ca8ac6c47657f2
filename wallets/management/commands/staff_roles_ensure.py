"""Create or repair the back-office role groups in tenants created before the roles
existed (new tenants get them at creation). Run after `migrate_schemas`."""

from __future__ import annotations

from typing import Any

from django_tenants.utils import schema_context

from tenants.commands import TenantCommand
from tenants.selectors import tenant_schemas_all
from wallets.services.roles import staff_roles_ensure


class Command(TenantCommand):
    help = "Create or repair the viewer/operator/finance groups in every tenant, switched off or not (or --tenant X)."
    tenant_help = "one tenant schema"
    tenant_unknown = "no tenant"

    def handle(self, *args: Any, **options: Any) -> None:
        for schema in self.tenants_chosen(tenant_schemas_all(), options["tenant"]):
            with schema_context(schema):
                groups = staff_roles_ensure()
            self.stdout.write(f"{schema}: {', '.join(sorted(groups))}")
