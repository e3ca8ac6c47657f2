"""`manage.py tenant_restore --schema NAME --source DSN [--dry-run] [--keep-replaced]`: put one
tenant's schema back as it is in database DSN (the cluster's backup restored to an instant on
a scratch server), every other tenant left as it is. `--cleanup [--source DSN]`: after a run
that died, switch the tenant on again if that run switched it off, drop its staging schema
(and the scratch databases on the source's server). The runbook: docs/RELIABILITY.md,
"Restore one tenant"; what it does and the locks it takes: tenants/restore.py."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.restore import TenantRestoreRefused, tenant_restore, tenant_restore_cleanup


class Command(BaseCommand):
    help = "Restore one tenant's schema from a database restored to an instant (staged, reconciled, then swapped in)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schema", required=True, help="the tenant's schema name")
        parser.add_argument("--source", help="libpq DSN of the database restored to the instant (a scratch server)")
        parser.add_argument("--dry-run", action="store_true", help="stage and check the copy, then drop it: no tenant's data changes")
        parser.add_argument("--keep-replaced", action="store_true", help="keep the live schema as <schema>_replaced_<stamp> (default: dropped)")
        parser.add_argument("--cleanup", action="store_true",
                            help="after a run that died: the tenant on again if that run switched it off, its staging schema dropped")
        parser.add_argument("--lock-timeout-ms", type=int, default=10_000, help="how long the swap waits for the tenant's tables")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["cleanup"]:
            self._cleanup(options)
            return
        if not options["source"]:
            raise CommandError("--source is required (except with --cleanup)")
        try:
            report = tenant_restore(
                schema_name=options["schema"], source=options["source"], dry_run=options["dry_run"],
                keep_replaced=options["keep_replaced"], lock_timeout_ms=options["lock_timeout_ms"],
                progress=lambda line: self.stderr.write(line),
            )
        except TenantRestoreRefused as exc:
            raise CommandError(f"refused: {exc}") from exc
        for note in report.notes:
            self.stdout.write(f"  note: {note}")
        timings = ", ".join(f"{step} {at:.1f} s" for step, at in report.seconds.items())
        if report.dry_run:
            self.stdout.write(self.style.SUCCESS(f"dry run: {report.schema_name} would be restored ({report.tables} tables, "
                                                 f"checked clean); staging dropped, nothing changed ({timings})"))
            return
        aside = "none (the live schema was gone)"
        if report.replaced_schema:
            aside = f"{report.replaced_schema} ({'kept' if report.replaced_kept else 'dropped'})"
        self.stdout.write(self.style.SUCCESS(f"restored {report.schema_name} ({report.tables} tables); replaced: {aside} ({timings})"))

    def _cleanup(self, options: dict[str, Any]) -> None:
        try:
            done = tenant_restore_cleanup(schema_name=options["schema"], source=options["source"], lock_timeout_ms=options["lock_timeout_ms"])
        except TenantRestoreRefused as exc:
            raise CommandError(f"refused: {exc}") from exc
        self.stdout.write(f"staging dropped: {', '.join(done.staging_dropped) or 'none'}")
        self.stdout.write(f"tenant switched on again: {'yes' if done.switched_on else 'no (no run had switched it off, or it is on)'}")
        if options["source"]:
            self.stdout.write(f"scratch databases dropped: {', '.join(done.scratch_dropped) or 'none'}")
        for name in done.replaced_left:
            self.stdout.write(f"  left alone: {name} (a replaced schema: compare, then DROP SCHEMA ... CASCADE)")
