"""`manage.py reconcile [--tenant SCHEMA] [--check NAME ...]`: run reconciliation now, in one
tenant or every active tenant, with a progress bar on stderr. Exits 0 when every run is
clean, 1 when any run has findings (listed, and stored like a beat run's)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django_tenants.utils import schema_context

from reconciliation.models import RunTrigger
from reconciliation.registry import CHECKS, check_get
from reconciliation.services import reconciliation_run_execute, reconciliation_run_request
from tenants.commands import TenantCommand
from tenants.selectors import tenant_schemas_active

BAR_WIDTH = 30
SHOWN_PER_KIND = 5


class Command(TenantCommand):
    help = "Reconcile the ledger, balances, payments, idempotency keys, outbox and webhooks; exit 1 on findings."
    tenant_help = "one tenant's schema name (default: every active tenant)"
    tenant_unknown = "no active tenant with schema"
    tenant_unknown_returncode = 2  # 1 is findings

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--check", action="append", choices=[c.name for c in CHECKS], help="run only this check (repeatable)")
        parser.add_argument("--chunk-size", type=int, default=2000, help="rows fetched per round trip by the streaming checks")

    def handle(self, *args: Any, **options: Any) -> None:
        schemas = self.tenants_chosen(tenant_schemas_active(), options["tenant"])
        checks = [check_get(name) for name in options["check"]] if options["check"] else None
        with_findings = 0
        for schema_name in schemas:
            started = time.monotonic()
            with schema_context(schema_name):
                run = reconciliation_run_request(trigger=RunTrigger.COMMAND, requested_by="manage.py reconcile")
                run = reconciliation_run_execute(run_id=run.pk, checks=checks, chunk_size=options["chunk_size"], progress=self._progress(schema_name))
                seconds = time.monotonic() - started
                if run.findings_count:
                    with_findings += 1
                    self.stdout.write(self.style.ERROR(f"{schema_name}: run {run.pk}: {run.findings_count} finding(s) in {seconds:.1f} s"))
                    self._findings_show(run)
                else:
                    self.stdout.write(self.style.SUCCESS(f"{schema_name}: run {run.pk}: clean in {seconds:.1f} s"))
                for name, entry in run.report["checks"].items():
                    self.stdout.write(f"  {name:<20} {entry['findings']:>7} finding(s) {entry['seconds']:>8.3f} s  {entry['stats']}")
        if with_findings:
            raise CommandError(f"{with_findings} of {len(schemas)} tenant(s) have findings", returncode=1)

    def _progress(self, schema_name: str) -> Any:
        def show(done: int, total: int, name: str) -> None:
            filled = BAR_WIDTH * done // max(total, 1)
            self.stderr.write(f"\r{schema_name} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {name:<20}", ending="")
            if done == total:
                self.stderr.write("")
            self.stderr.flush()

        return show

    def _findings_show(self, run: Any) -> None:
        for kind, count in run.report["by_kind"].items():
            self.stdout.write(f"  {kind}: {count}")
            for finding in run.findings.filter(kind=kind).order_by("id")[:SHOWN_PER_KIND]:
                self.stdout.write(f"    - {finding.summary}")
