"""`manage.py staged_migration --help` names the registered migrations and the phases, read
from the registry (wallets.staged.spec), not from a hand-written list."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wallets.management.commands.staged_migration import PHASES, help_epilog
from wallets.staged import spec
from wallets.staged.spec import BatchResult, StagedMigration, VerifyReport, staged_migrations

ROOT = Path(__file__).resolve().parent.parent


def test_help_lists_every_registered_migration_and_every_phase() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "TALLY_LOG_LEVEL": "WARNING"}
    result = subprocess.run([sys.executable, "manage.py", "staged_migration", "--help"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60, check=True)
    text = result.stdout
    registered = staged_migrations()
    assert set(registered) >= {"customer_contacts", "merchant_daily_totals", "webhook_secrets"}
    for name, migration in registered.items():
        assert f"  {name} " in text and migration.description in text, name
    positions = [text.index(f"\n  {phase} ") for phase in PHASES]
    assert positions == sorted(positions), "phases listed in the order they are run"
    assert PHASES == ("expand", "backfill", "verify", "switch-reads", "contract", "rollback")


class _Probe(StagedMigration):
    name = "probe_migration"
    description = "a probe registered by the test only"
    default_batch = 7

    def backfill_total(self) -> int:
        return 0

    def backfill_batch(self, *, after: str, limit: int, dry_run: bool) -> BatchResult:
        return BatchResult(cursor=None, rows_seen=0, rows_written=0)

    def verify(self) -> VerifyReport:
        return VerifyReport()


def test_a_newly_registered_migration_appears_in_the_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(spec._registry, _Probe.name, _Probe())
    text = help_epilog()
    assert "  probe_migration " in text and "a probe registered by the test only" in text and "batch 7 rows" in text
