"""The base of the management commands that work tenant by tenant."""

from __future__ import annotations

from collections.abc import Iterable

from django.core.management.base import BaseCommand, CommandError, CommandParser


class TenantCommand(BaseCommand):
    """A command run in each tenant of a selection, or only in the one `--tenant` names."""

    tenant_help = "one tenant schema (default: every tenant, switched off or not)"
    tenant_unknown = "no tenant with schema"  # the error's words, before the name
    tenant_unknown_returncode = 1

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help=self.tenant_help)

    def tenants_chosen(self, schemas: Iterable[str], tenant: str | None) -> list[str]:
        """`schemas`, or only `tenant` (the `--tenant` option) if set: an error if it is not among them."""
        schemas = list(schemas)
        if not tenant:
            return schemas
        if tenant not in schemas:
            raise CommandError(f"{self.tenant_unknown} {tenant!r}", returncode=self.tenant_unknown_returncode)
        return [tenant]
