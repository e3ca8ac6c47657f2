"""Give every account of every tenant (or one) its balance rows ahead of the first posting
that needs them (which would make them while holding its other rows): batches of
accounts, each its own short transaction, new rows only; safe to stop and run again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django_tenants.utils import schema_context

from tenants.commands import TenantCommand
from tenants.selectors import tenant_schemas_all
from wallets.models import Account
from wallets.services.ledger import balance_rows_create


class Command(TenantCommand):
    help = "Create the missing balance rows of every account (batched, idempotent, resumable)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--batch", type=int, default=500, help="accounts per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        for schema_name in self.tenants_chosen(sorted(tenant_schemas_all()), options["tenant"]):
            with schema_context(schema_name):
                total, done, after = Account.objects.count(), 0, ""
                while True:
                    batch = list(Account.objects.filter(id__gt=after).order_by("id")[: options["batch"]])
                    if not batch:
                        break
                    balance_rows_create(accounts=batch)  # one statement per batch: commits on its own
                    done, after = done + len(batch), batch[-1].id
                    self.stdout.write(f"{schema_name}: {done}/{total} accounts")
            self.stdout.write(self.style.SUCCESS(f"{schema_name}: done"))
