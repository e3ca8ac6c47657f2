"""Staged data migrations, per tenant, under live traffic (wallets.staged); `--help` lists
the migrations and the phases. Exits 1 if any tenant refused the phase or failed verify.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter
from django_tenants.utils import schema_context

from tenants.commands import TenantCommand
from tenants.selectors import tenant_schemas_all
from wallets.locks import staged_run_lock
from wallets.staged import runner
from wallets.staged.spec import StagedMigration, StagedMigrationRefused, staged_migrations

# In the order they are run.
PHASE_HELP = {
    "expand": "make the new representation; writers dual-write from here on",
    "backfill": "copy the existing rows in batches (idempotent, resumable, --batch/--rate/--dry-run)",
    "verify": "compare old and new in one snapshot; must pass before reads switch",
    "switch-reads": "readers use the new representation",
    "contract": "remove the old representation (after verify and switch-reads)",
    "rollback": "go back one phase, while the old representation is still there (before contract)",
}
PHASES = tuple(PHASE_HELP)
_PHASE_RUNS = {
    "expand": runner.staged_expand, "verify": runner.staged_verify, "switch-reads": runner.staged_switch_reads,
    "contract": runner.staged_contract, "rollback": runner.staged_rollback,
}


def help_epilog() -> str:
    """The registered migrations and the phases, read from the registry (for --help)."""
    lines = ["staged migrations (NAME):"]
    for name, migration in staged_migrations().items():
        lines.append(f"  {name:<24} {migration.description}")
        lines.append(f"  {'':<24} backfill batch {migration.default_batch} rows" + (
            "; the old representation survives contract" if migration.old_survives_contract else ""))
    lines += ["", "phases (PHASE), in order:"]
    lines += [f"  {phase:<24} {text}" for phase, text in PHASE_HELP.items()]
    lines += ["", "status [NAME] shows each tenant's phase and backfill progress."]
    return "\n".join(lines)


class _HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's option order, and the epilog's lines kept as written."""


class Command(TenantCommand):
    help = "Run one phase of a staged data migration on every tenant (or one), or show their status."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, epilog=help_epilog(), **kwargs)
        parser.formatter_class = _HelpFormatter
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="+", metavar="status [NAME] | NAME PHASE")
        super().add_arguments(parser)
        parser.add_argument(
            "--batch", type=int, default=None,
            help="backfill: rows per batch, one transaction each (default: the migration's, listed below)",
        )
        parser.add_argument("--rate", type=float, default=0.0, help="backfill: at most this many rows per second (0: unthrottled)")
        parser.add_argument("--dry-run", action="store_true", help="backfill: count what would be written, write nothing")
        parser.add_argument("--no-progress", action="store_true", help="backfill: no progress bar")

    def handle(self, *args: str, **options: Any) -> None:
        known = staged_migrations()
        schemas = self.tenants_chosen(sorted(tenant_schemas_all()), options["tenant"])
        if args[0] == "status":
            names = list(args[1:]) or list(known)
            for name in names:
                if name not in known:
                    raise CommandError(f"unknown staged migration {name!r}; known: {', '.join(known)}")
            self._status(schemas, [known[n] for n in names])
            return
        if len(args) != 2 or args[0] not in known or args[1] not in PHASES:
            raise CommandError(f"usage: staged_migration status [NAME] | NAME {{{','.join(PHASES)}}}; known: {', '.join(known)}")
        migration, phase = known[args[0]], args[1]
        failed = False
        for schema in schemas:
            with schema_context(schema):
                with staged_run_lock(name=migration.name) as got:
                    if not got:
                        self.stderr.write(f"{schema}: {migration.name}: another run holds this migration on this tenant; try again later")
                        failed = True
                        continue
                    try:
                        outcome = self._run(schema, migration, phase, options)
                    except StagedMigrationRefused as exc:
                        self.stderr.write(f"{schema}: {migration.name} {phase}: refused: {exc}")
                        failed = True
                        continue
            line = f"{schema}: {migration.name} {phase}: {outcome.message}"
            if outcome.ok:
                self.stdout.write(self.style.SUCCESS(line) if outcome.changed else line)
            else:
                self.stderr.write(line)
                failed = True
        if failed:
            sys.exit(1)

    def _run(self, schema: str, migration: StagedMigration, phase: str, options: dict[str, Any]) -> runner.Outcome:
        if phase != "backfill":
            return _PHASE_RUNS[phase](migration=migration)
        bar = None if options["no_progress"] else _ProgressBar(self, f"{schema}: {migration.name}")
        outcome = runner.staged_backfill(
            migration=migration, batch=options["batch"] or migration.default_batch, rows_per_second=options["rate"], dry_run=options["dry_run"],
            progress=bar.update if bar else None,
        )
        if bar:
            bar.finish()
        return outcome

    def _status(self, schemas: list[str], migrations: list[StagedMigration]) -> None:
        header = f"{'tenant':<20} {'migration':<24} {'phase':<15} {'backfill':<22} {'written':>8} {'seconds':>8} {'verify':<7} phase since"
        self.stdout.write(header)
        for schema in schemas:
            with schema_context(schema):
                for migration in migrations:
                    state = runner.staged_state(migration=migration)
                    verify = {True: "passed", False: "FAILED", None: "-"}[state.verify_ok]
                    progress = f"{state.rows_done}/{state.rows_total}" + (f" @{state.cursor[:10]}" if state.cursor else "")
                    self.stdout.write(
                        f"{schema:<20} {migration.name:<24} {state.phase:<15} {progress:<22} {state.rows_written:>8} "
                        f"{state.backfill_seconds:>8.1f} {verify:<7} {state.phase_changed_at:%Y-%m-%d %H:%M:%S}"
                    )


class _ProgressBar:
    """A one-line progress bar on a terminal; a line every few seconds otherwise."""

    def __init__(self, command: BaseCommand, label: str) -> None:
        self.command, self.label = command, label
        self.tty = command.stdout.isatty()
        self.last = 0.0

    def update(self, done: int, total: int, rate: float) -> None:
        share = done / total if total else 1.0
        bar = "#" * int(share * 30)
        line = f"{self.label} [{bar:<30}] {share:6.1%} {done}/{total} rows {rate:,.0f} rows/s"
        if self.tty:
            self.command.stdout.write("\r" + line, ending="")
            self.command.stdout.flush()
        elif time.monotonic() - self.last >= 2.0 or done >= total:
            self.command.stdout.write(line)
            self.last = time.monotonic()

    def finish(self) -> None:
        if self.tty:
            self.command.stdout.write("")
