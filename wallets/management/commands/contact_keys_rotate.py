"""Re-encrypt customer contact data under the newest key of TALLY_CONTACT_ENCRYPTION_KEYS,
in batches (safe to stop and run again). Once it has run on every tenant, the old key can
leave the list."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django_tenants.utils import schema_context

from tenants.commands import TenantCommand
from tenants.selectors import tenant_schemas_all
from wallets.services.contacts import customer_contacts_reencrypt


class Command(TenantCommand):
    help = "Re-encrypt customer contact data under the newest key (batched, idempotent, resumable)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--batch", type=int, default=500, help="customers per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        unopened: list[str] = []
        for schema in self.tenants_chosen(sorted(tenant_schemas_all()), options["tenant"]):
            with schema_context(schema):
                cursor: str | None = ""
                rewritten = 0
                while cursor is not None:
                    cursor, count, bad = customer_contacts_reencrypt(after=cursor, limit=options["batch"])
                    rewritten += count
                    unopened += [f"{schema} {customer_id}" for customer_id in bad]
            self.stdout.write(self.style.SUCCESS(f"{schema}: {rewritten} customers re-encrypted under the newest key"))
        if unopened:
            raise CommandError(
                f"{len(unopened)} customers hold a contact token no TALLY_CONTACT_ENCRYPTION_KEYS key opens (left as they are): "
                + "; ".join(unopened[:50])
            )
