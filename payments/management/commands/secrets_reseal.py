"""Re-seal every tenant's stored secrets under the first key of TALLY_SEALING_KEYS (and
customer contacts under the newest TALLY_CONTACT_ENCRYPTION_KEYS key), online, in short
batches; a value already under the first key is left as it is, so a stopped run is simply
run again. Rotation: docs/ARCHITECTURE.md, "Secrets at rest"."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django_tenants.utils import schema_context

from tenants.commands import TenantCommand
from tenants.selectors import tenant_schemas_all
from wallets.sealing import sealed_stores, sealing_ring


class Command(TenantCommand):
    help = "Re-seal every stored secret under the sealing ring's first key (batched, online, safe to re-run)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--batch", type=int, default=500, help="rows per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        schemas = self.tenants_chosen(sorted(tenant_schemas_all()), options["tenant"])
        primary = sealing_ring().primary
        total, unopened = 0, []
        for schema in schemas:
            with schema_context(schema):
                counts = []
                for store in sealed_stores():
                    cursor: str | None = ""
                    resealed = 0
                    while cursor is not None:
                        result = store.reseal_batch(cursor, options["batch"])
                        cursor, resealed = result.cursor, resealed + result.resealed
                        unopened += [f"{schema} {store.name} {row_id}" for row_id in result.unopened]
                    counts.append(f"{store.name} {resealed}")
                    total += resealed
            self.stdout.write(f"{schema}: re-sealed " + ", ".join(counts))
        if unopened:
            # The rest is done; these keep their old key, so it must stay in the ring for now.
            raise CommandError(
                f"{len(unopened)} stored values do not open with this ring and were left as they are (keep their key, and"
                " TALLY_SEALING_LEGACY_SECRET_KEY if set, since legacy (v1) values may be among them, until they are fixed or"
                " re-entered): " + "; ".join(unopened[:50])
            )
        self.stdout.write(self.style.SUCCESS(f"done: {total} rows re-sealed under key {primary!r} in {len(schemas)} tenants, 0 unopened"))
        # Every value now opens under the first key, so none is left under the legacy one
        # (a process still sealing under an older key shows in the next run's count).
        if options["tenant"]:
            self.stdout.write(f"no legacy (v1) values remain in {options['tenant']} (other tenants: run without --tenant)")
        else:
            self.stdout.write("no legacy (v1) values remain: TALLY_SEALING_LEGACY_SECRET_KEY can be unset")
