"""What the PostgreSQL failover tests share, and libpq's multi-host DATABASE_URL.

The failover itself is Patroni's (tests/test_patroni_failover.py, docs/RELIABILITY.md); the
machinery here drives Tally through it, as it drives the stack kills (tests/test_stack_kills.py):
keyed payments from several clients, each key sent again until a final answer (`_pay`,
`clients_start`), the seed and the check run against the cluster in a process of their own
(`_app`, tests/failover_app.py), and `manage.py reconcile` of the demo tenant's books
(`ledger_reconcile`). The manual pair this file once failed over by hand (tests/pg_pair.py:
`pg_ctl promote`, then emptying `synchronous_standby_names`) is no longer a runbook; the pair
stays, a plain primary and synchronous standby for tests that need PostgreSQL servers of their own.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from tests.faults import ROOT

DOMAIN = "demo.localhost"
FINAL = {201, 400, 402, 403, 404, 422}  # an answer that sending the key again would only replay


@dataclass
class Outcome:
    key: str
    answers: list[tuple[float, int, str]] = field(default_factory=list)  # (monotonic time, status, payment id)
    errors: int = 0  # no answer: refused, reset, timed out


def _app(env: dict[str, str], *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "tests.failover_app", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def ledger_reconcile(env: dict[str, str], *, tenant: str | None = "demo") -> subprocess.CompletedProcess[str]:
    """`manage.py reconcile` of a tenant's books (None: every active tenant's), without the PSP
    compares: in a shared test database the demo tenant's card gateway may be an earlier test's
    simulator, long stopped, and no PSP answers a restored copy; a PSP that does not answer is
    a warning, which is not what these tests judge."""
    from reconciliation.registry import CHECKS

    checks = [arg for check in CHECKS if check.name not in ("psp_settlement", "payouts") for arg in ("--check", check.name)]
    which = ["--tenant", tenant] if tenant is not None else []
    return subprocess.run([sys.executable, "manage.py", "reconcile", *which, *checks], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _pay(port: int, terminal_key: str, customer: str, amount: int, outcome: Outcome, stop_at: float) -> None:
    """One key, sent again until a final answer (or the test's deadline)."""
    body = json.dumps({"customer": customer, "asset": "JPY", "amount": amount})
    headers = {"Host": DOMAIN, "Authorization": f"Bearer {terminal_key}", "Idempotency-Key": outcome.key,
               "Content-Type": "application/json"}
    while time.monotonic() < stop_at:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        try:
            conn.request("POST", "/v1/terminal/payments", body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        except OSError:
            outcome.errors += 1
            time.sleep(0.2)
            continue
        finally:
            conn.close()
        payment = ""
        if response.status == 201:
            payment = json.loads(payload)["id"]
        outcome.answers.append((time.monotonic(), response.status, payment))
        if response.status in FINAL:
            return
        time.sleep(0.2)


def clients_start(
    port: int, terminal_key: str, customers: list[str], *, clients: int, prefix: str, deadline: float, outcomes: list[Outcome]
) -> tuple[threading.Event, list[threading.Thread]]:
    """`clients` threads paying with fresh keys until the event is set, each key sent again
    until a final answer (`_pay`); every key's outcome is appended to `outcomes`."""
    lock = threading.Lock()
    stop_new = threading.Event()

    def client(n: int) -> None:
        while not stop_new.is_set():
            outcome = Outcome(key=f"{prefix}-{n}-{uuid.uuid4().hex}")
            with lock:
                outcomes.append(outcome)
                seq = len(outcomes) - 1
            # A customer and amount of its own for each key (no duplicate-charge suspects).
            _pay(port, terminal_key, customers[seq % len(customers)], 1 + seq // len(customers), outcome, deadline)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    return stop_new, threads


def _test_database_url() -> str:
    settings = connection.settings_dict
    return f"postgresql://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"


def test_a_multi_host_database_url_reaches_libpq_as_host_and_port_lists() -> None:
    import environ
    from psycopg.conninfo import conninfo_attempts, make_conninfo

    config = environ.Env.db_url_config("postgres://u@10.0.0.1:5433,10.0.0.2:5434/tally?target_session_attrs=read-write")
    assert (config["HOST"], config["PORT"], config["NAME"]) == ("10.0.0.1,10.0.0.2", "5433,5434", "tally")
    assert config["OPTIONS"] == {"target_session_attrs": "read-write"}
    params = {"host": config["HOST"], "port": config["PORT"], "dbname": config["NAME"], **config["OPTIONS"]}
    attempts = conninfo_attempts({"host": params["host"], "port": params["port"], "dbname": "tally"})
    assert [(a["host"], a["port"]) for a in attempts] == [("10.0.0.1", "5433"), ("10.0.0.2", "5434")]
    assert "target_session_attrs=read-write" in make_conninfo(**params)
