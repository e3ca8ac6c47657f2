"""Give every account of every tenant (or one) its balance rows: a customer's row per
asset, 32 shards per merchant and system account (wallets.services.ledger.balance_rows_create).

Accounts made before balance rows were made with their account (and accounts of an asset
added outside `asset_create`) get their rows lazily, by the first posting that needs them,
which makes the row while that posting holds its other rows. This fills them in ahead,
under live traffic: batches of accounts, each its own short transaction, new rows only
(existing rows are never touched, so it is safe to stop at any point and to run again).

    python manage.py balance_rows_backfill [--tenant SCHEMA] [--batch 500]
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django_tenants.utils import schema_context

from tenants.selectors import tenant_schemas_active
from wallets.models import Account
from wallets.services.ledger import balance_rows_create


class Command(BaseCommand):
    help = "Create the missing balance rows of every account (batched, idempotent, resumable)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="one tenant schema (default: every active tenant)")
        parser.add_argument("--batch", type=int, default=500, help="accounts per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        schemas = sorted(tenant_schemas_active())
        if options["tenant"]:
            schemas = [schema for schema in schemas if schema == options["tenant"]]
        for schema_name in schemas:
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
