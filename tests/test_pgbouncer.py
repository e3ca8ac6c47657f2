"""The payment and idempotency suites pass through a PgBouncer in session mode, and the
bouncer is what carried their connections.

The test starts its own PgBouncer (devtools/pgbouncer.py: session mode, trusted clients,
every database passed through to the PostgreSQL the suite uses) on a loopback port of
6440-6449 and runs the suites in a pytest subprocess whose DATABASE_URL names the bouncer,
with a test database of its own. Then it reads the bouncer's admin console: the
subprocess's test database must have a session-mode pool and thousands of queries counted
by the bouncer. A run that reached PostgreSQL some other way (a setting that ignored
DATABASE_URL's port, a hard-coded server) leaves the bouncer's counters at zero and fails
here, whatever the suites said.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from psycopg.rows import dict_row

from devtools.pgbouncer import pgbouncer_argv, pgbouncer_config_write
from tests.faults import ROOT, free_port_in, until
from tests.receivers import process_stop

SUITES = [
    "tests/test_idempotency.py",
    "tests/test_idempotency_concurrency.py",
    "tests/api/test_money_endpoints.py",
    "tests/test_ledger_concurrency.py",
    # Prepared statements are session state: they must still be found where they were prepared.
    "tests/test_prepared_statements.py",
]


def _console(port: int, command: str) -> list[dict[str, Any]]:
    with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/pgbouncer", autocommit=True, prepare_threshold=None,
                         row_factory=dict_row) as console:
        return console.execute(command).fetchall()  # type: ignore[arg-type]  # the console takes only simple queries


def _console_answers(port: int) -> bool:
    try:
        return bool(_console(port, "SHOW VERSION"))
    except psycopg.OperationalError:
        return False


@contextmanager
def bouncer_running(*, pool_mode: str = "session", pool_size: int = 60) -> Iterator[int]:
    """A PgBouncer of the test's own in front of the suite's PostgreSQL; yields its port."""
    upstream = settings.DATABASES["default"]
    directory = Path(tempfile.mkdtemp(prefix="tally-pgbouncer-"))
    port = free_port_in(range(6440, 6450))
    ini = pgbouncer_config_write(directory=directory, port=port, upstream_host=upstream["HOST"] or "127.0.0.1",
                                 upstream_port=int(upstream["PORT"] or 5432), pool_mode=pool_mode, pool_size=pool_size)
    process = subprocess.Popen(pgbouncer_argv(ini), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        until(lambda: _console_answers(port), "pgbouncer to answer", seconds=20,
              why=lambda: (directory / "pgbouncer.log").read_text() if (directory / "pgbouncer.log").exists() else "no log")
        yield port
    finally:
        process_stop(process, timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def bouncer_port() -> Iterator[int]:
    with bouncer_running() as port:
        yield port


def test_payment_and_idempotency_suites_pass_through_pgbouncer_in_session_mode(bouncer_port: int) -> None:
    outer = settings.DATABASES["default"]
    # The subprocess's own test database (pytest-django prefixes test_), beside this run's.
    inner_name = f"{outer['NAME'].removeprefix('test_')}_pgbouncer"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS_MODULE"))}
    env.update({
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{bouncer_port}/tally",
        "TALLY_TEST_DB_NAME": inner_name,
        "REDIS_URL": settings.REDIS_URL,  # this worker's Redis database; this worker waits meanwhile
    })
    env.pop("CELERY_BROKER_URL", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *SUITES],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary

    test_db = f"test_{inner_name}"
    stats = {row["database"]: row for row in _console(bouncer_port, "SHOW STATS")}
    assert test_db in stats, f"the bouncer never served {test_db}: {sorted(stats)}"
    # Thousands of statements: the migrations alone send more than this.
    assert stats[test_db]["total_query_count"] > 1000, stats[test_db]
    pools = [row for row in _console(bouncer_port, "SHOW POOLS") if row["database"] == test_db]
    assert pools and {row["pool_mode"] for row in pools} == {"session"}, pools


def test_transaction_mode_loses_the_session_state_tenants_and_prepared_statements_need() -> None:
    """Why session mode (docs/SCALING.md): in transaction mode a client's next statement may
    run on a server session another client set up, so the tenant's search_path and a
    PREPAREd statement do not follow the client. Two raw clients, no Django."""
    with bouncer_running(pool_mode="transaction", pool_size=1) as port:
        url = f"postgres://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, autocommit=True) as a, psycopg.connect(url, autocommit=True) as b:
            a.execute("SET search_path = tenant_a")
            b.execute("SET search_path = tenant_b")
            # a's own SET was the last thing a sent, yet a sees b's tenant.
            assert a.execute("SHOW search_path").fetchone() == ("tenant_b",)
    with bouncer_running(pool_mode="transaction", pool_size=2) as port:
        url = f"postgres://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, autocommit=True) as a, psycopg.connect(url, autocommit=True) as b:
            a.execute("BEGIN")
            a.execute("SELECT 1")  # a holds one server session
            b.execute("PREPARE tally_probe AS SELECT 1")  # so b prepares on the other
            a.execute("COMMIT")  # a's session goes back to the pool, and b is lent it next
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                b.execute("EXECUTE tally_probe")
    with bouncer_running(pool_mode="session", pool_size=1) as port:  # the same steps in session mode keep both
        url = f"postgres://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, autocommit=True) as a:
            a.execute("SET search_path = tenant_a")
            a.execute("PREPARE tally_probe AS SELECT 1")
            assert a.execute("SHOW search_path").fetchone() == ("tenant_a",)
            assert a.execute("EXECUTE tally_probe").fetchone() == (1,)
