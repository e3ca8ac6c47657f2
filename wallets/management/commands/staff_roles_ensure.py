"""Create or repair the back-office role groups in tenants created before the roles
existed (new tenants get them at creation). Run after `migrate_schemas`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_tenants.utils import schema_context

from tenants.selectors import tenant_schemas_all
from wallets.services.roles import staff_roles_ensure


class Command(BaseCommand):
    help = "Create or repair the viewer/operator/finance groups in every tenant, switched off or not (or --tenant X)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="one tenant schema")

    def handle(self, *args: Any, **options: Any) -> None:
        schemas = tenant_schemas_all()
        if options["tenant"]:
            if options["tenant"] not in schemas:
                raise CommandError(f"no tenant {options['tenant']!r}")
            schemas = [options["tenant"]]
        for schema in schemas:
            with schema_context(schema):
                groups = staff_roles_ensure()
            self.stdout.write(f"{schema}: {', '.join(sorted(groups))}")
