"""A point-in-time restore from pgBackRest brings back every acknowledged payment and a
dropped tenant, with books that reconcile.

The test owns its PostgreSQL (tests/pgbackrest_support.py): archive_mode on, every WAL
segment pushed by `pgbackrest archive-push` to a repository under its tmp directory. The
test database is copied in, the demo tenant seeded and a second tenant made (with payments
of its own); a full backup; then keyed payments through gunicorn while a differential
backup runs, and for a while after it (those live only in the archived WAL). Once the last
client has its answer, the instant T is read from the server; then the mistake: `DROP
SCHEMA <tenant> CASCADE`. pgBackRest restores into a NEW data directory, replaying the WAL
up to T (`--type=time`), and PostgreSQL starts on it on another port. Against that copy,
Tally's own code shows: every payment answered 201 is there, the dropped tenant is back
with its payments, and `manage.py reconcile` reports nothing for any tenant.

Then the one-tenant restore into the running database: the demo tenant took payments after T
(before the DROP), so the cluster is not rolled back; `manage.py tenant_restore --schema
harbour --source <the copy>` runs against the ORIGINAL instance, where harbour was dropped.
After it, harbour is back there with every payment it had at T, `manage.py reconcile --tenant
harbour` finds nothing, and the demo tenant's payments after T are still there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from devtools.demo_seed import DEMO_SCHEMA
from tests.faults import ROOT, celery_beat, celery_worker, figures, free_port_in, until
from tests.live import gunicorn_running
from tests.pgbackrest_support import PORTS, pgbackrest_node
from tests.test_failover import FINAL, Outcome, _app, _test_database_url, clients_start, ledger_reconcile

DROPPED = "harbour"  # the tenant the mistake drops


def _step(env: dict[str, str], *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "tests.backup_app", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _tenant_restore(env: dict[str, str], source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", "tenant_restore", "--schema", DROPPED, "--source", source], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _env(port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/tally",
               REDIS_URL=str(settings.REDIS_URL), DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING")
    return env


@pytest.mark.proof
def test_a_point_in_time_restore_brings_back_every_acknowledged_payment_and_a_dropped_tenant(
    django_db_setup: None, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    long = request.config.getoption("--long")
    clients, customers_n, before, after = (4, 100, 6.0, 6.0) if long else (2, 30, 2.0, 2.0)
    started = time.monotonic()
    with pgbackrest_node(dump_from=_test_database_url()) as node:
        env = _env(node.cluster.port)
        seeded = _app(env, "seed", str(tmp_path / "keys.json"), str(customers_n))
        seeded_file = tmp_path / "seeded.json"
        seeded_file.write_text(json.dumps(seeded))
        harbour = _step(env, "tenant", DROPPED, "20" if long else "5")
        full_seconds = node.backup("full")

        outcomes: list[Outcome] = []
        with gunicorn_running(workers=2, log=tmp_path / "gunicorn.log", port=free_port_in(PORTS),
                              DATABASE_URL=env["DATABASE_URL"]) as port:
            stop_new, threads = clients_start(port, seeded["keys"]["terminal"], seeded["customers"], clients=clients, prefix="br",
                                              deadline=time.monotonic() + before + after + 300, outcomes=outcomes)
            time.sleep(before)
            diff_seconds = node.backup("diff")  # under the clients' payments
            time.sleep(after)  # payments the differential does not hold: only the WAL archive does
            stop_new.set()
            for thread in threads:
                thread.join(timeout=300)
        # T: after the last answer any client got, read from the server's clock (the
        # restore target is the server's time, not this process's).
        target = node.cluster.sql("SELECT clock_timestamp()")
        time.sleep(0.5)
        # Work after T that a whole-cluster restore would lose: the demo tenant's payments.
        after_t = _step(env, "pay", DEMO_SCHEMA, str(seeded_file), "5")["payments"]
        node.cluster.sql(f"DROP SCHEMA {DROPPED} CASCADE", "tally")
        assert DROPPED not in node.cluster.sql("SELECT string_agg(nspname, ',') FROM pg_namespace", "tally").split(",")
        node.archive_wait()  # the WAL up to the DROP is in the repository
        backups = node.info()["backup"]
        restored, restore_seconds = node.restore(target=target, name="restored")

        restored_env = _env(restored.port)
        checked = _app(restored_env, "check", str(seeded_file))
        harbour_restored = _step(restored_env, "check", DROPPED)
        # As after any restore, the worker and beat start on the copy and relay the outbox
        # events no worker had relayed yet (reconciliation flags old unpublished ones).
        worker = celery_worker(restored_env, tmp_path / "worker.log")
        beat = celery_beat(restored_env, tmp_path / "beat.log")
        try:
            until(lambda: _app(restored_env, "check", str(seeded_file))["events_unpublished"] == 0, "the outbox to be relayed",
                  seconds=180, poll=2, why=lambda: worker.output() + beat.output())
        finally:
            worker.stop()
            beat.stop()
        reconcile = ledger_reconcile(restored_env, tenant=None)

        # The one tenant put back into the running instance from the copy.
        tenant_started = time.monotonic()
        tenant_restore = _tenant_restore(env, f"postgres://postgres@127.0.0.1:{restored.port}/tally")
        tenant_restore_seconds = time.monotonic() - tenant_started
        assert tenant_restore.returncode == 0, tenant_restore.stdout[-3000:] + tenant_restore.stderr[-3000:]
        harbour_live = _step(env, "check", DROPPED)
        reconcile_live = ledger_reconcile(env, tenant=DROPPED)
        live = _app(env, "check", str(seeded_file))
    seconds = time.monotonic() - started

    unanswered = [o.key for o in outcomes if not o.answers or o.answers[-1][1] not in FINAL]
    assert not unanswered, f"{len(unanswered)} key(s) never got a final answer"
    acknowledged = {a[2] for o in outcomes for a in o.answers if a[1] == 201}
    assert len(acknowledged) >= 10 * clients, len(acknowledged)  # a load, not a handful
    assert acknowledged <= set(checked["payments"]), sorted(acknowledged - set(checked["payments"]))[:5]
    assert harbour_restored == harbour  # the dropped tenant is back, every payment and posting of it
    assert reconcile.returncode == 0, reconcile.stdout[-3000:] + reconcile.stderr[-3000:]
    assert not set(after_t) & set(checked["payments"])  # the copy stops at T
    assert harbour_live == harbour  # back in the running instance: every payment and posting it had at T
    assert reconcile_live.returncode == 0, reconcile_live.stdout[-3000:] + reconcile_live.stderr[-3000:]
    assert set(after_t) | acknowledged <= set(live["payments"])  # the other tenant's work, before and after T, untouched
    assert [b["type"] for b in backups] == ["full", "diff"]
    full, diff = backups
    figures("pitr-restore", payments=len(acknowledged), full_s=round(full_seconds, 1), diff_s=round(diff_seconds, 1),
            full_mb=round(full["info"]["size"] / 1e6, 1), full_repo_mb=round(full["info"]["repository"]["size"] / 1e6, 1),
            diff_repo_mb=round(diff["info"]["repository"]["delta"] / 1e6, 1), restore_s=round(restore_seconds, 1),
            tenant_restore_s=round(tenant_restore_seconds, 1), harbour_payments=len(harbour["payments"]), after_t=len(after_t), lost=0,
            seconds=round(seconds, 1))
