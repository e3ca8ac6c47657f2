"""A PostgreSQL failover under keyed payments loses no acknowledged payment and doubles none.

The test builds its own pair (tests/pg_pair.py): a primary and a synchronous standby on
loopback ports of their own, the test database copied in, both configured alike (the
standby, promoted, waits for a synchronous standby of its own until the operator's second
step drops that). gunicorn, the Celery worker and
beat run as `make run` runs them, with DATABASE_URL in libpq's multi-host form
(`...@127.0.0.1:P,127.0.0.1:S/tally?target_session_attrs=read-write`). Clients send keyed
payments; the primary is killed with SIGKILL (every process of it), the standby promoted,
and a few seconds later its synchronous_standby_names emptied.
Each client sends each key again until it gets a final answer. Then: every payment answered
201 before the kill is on the new primary; each key has exactly one payment; no payment
exists that no key was answered with; every outbox event is relayed; and reconciliation
(ledger against balances, payments, keys, outbox) reports nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.faults import ROOT, OwnRedis, celery_beat, celery_worker, figures, own_redis, until
from tests.live import gunicorn_running
from tests.pg_pair import Cluster, pg_pair

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


def ledger_reconcile(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`manage.py reconcile` of the demo tenant's books, without the PSP compares: in a shared
    test database the demo tenant's card gateway may be an earlier test's simulator, long
    stopped, and a PSP that does not answer is a warning, which is not what these tests judge."""
    from reconciliation.registry import CHECKS

    checks = [arg for check in CHECKS if check.name not in ("psp_settlement", "payouts") for arg in ("--check", check.name)]
    return subprocess.run([sys.executable, "manage.py", "reconcile", "--tenant", "demo", *checks], cwd=ROOT, env=env,
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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[OwnRedis]:
    with own_redis(tmp_path) as server:
        yield server


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


@pytest.mark.proof
def test_a_failover_under_keyed_payments_loses_no_acknowledged_payment_and_doubles_none(
    django_db_setup: None, redis_server: OwnRedis, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    long = request.config.getoption("--long")
    clients, before, hold, after = (6, 8.0, 10.0, 12.0) if long else (3, 4.0, 6.0, 6.0)
    started = time.monotonic()
    with pg_pair(dump_from=_test_database_url()) as (primary, standby):
        url = f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/tally?target_session_attrs=read-write"
        env = dict(os.environ)
        env.pop("PYTEST_XDIST_WORKER", None)
        env.update(DJANGO_SETTINGS_MODULE="config.settings.local", DATABASE_URL=url, REDIS_URL=redis_server.url,
                   CELERY_BROKER_URL=redis_server.url, DJANGO_DEBUG="false", TALLY_LOG_LEVEL="INFO",
                   # Short limits, so that relays caught in a commit that waits (before the
                   # operator's second step) reach the soft limit during the test, as they do
                   # after 120 s in production.
                   CELERY_TASK_SOFT_TIME_LIMIT="3", CELERY_TASK_TIME_LIMIT="20")
        seeded = _app(env, "seed", str(tmp_path / "keys.json"), "100")
        # The pair starts from a dump of the test database, whose demo schema may hold an
        # earlier test's payments: the checks count this test's customers' payments only.
        seeded_file = tmp_path / "seeded.json"
        seeded_file.write_text(json.dumps(seeded))
        terminal_key, customers = seeded["keys"]["terminal"], seeded["customers"]
        worker = celery_worker(env, tmp_path / "worker.log")
        beat = celery_beat(env, tmp_path / "beat.log")
        web_env = {k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
        web_env["TALLY_LOG_LEVEL"] = "WARNING"
        try:
            with gunicorn_running(workers=2, log=tmp_path / "gunicorn.log", TALLY_OUTBOX_RELAY_KICK="true", **web_env) as port:
                outcomes, killed_at = _load_through_failover(port, terminal_key, customers, primary, standby, clients, before, hold,
                                                             after)
                sweeps_sent = beat.log.read_text().count("Sending due task webhooks-relay")
            for proc in (worker, beat):
                assert proc.alive(), proc.output()
            # Beat reads its schedule from the database: it carries on against the new primary.
            until(lambda: beat.log.read_text().count("Sending due task webhooks-relay") > sweeps_sent, "beat's next sweep",
                  seconds=30, why=beat.output)
            checked = _app(env, "check", str(seeded_file))
            until(lambda: _app(env, "check", str(seeded_file))["events_unpublished"] == 0, "every outbox event to be relayed", seconds=120, poll=2,
                  why=lambda: worker.output() + beat.output())
        finally:
            worker.stop()
            beat.stop()
        reconcile = ledger_reconcile(env)
    seconds = time.monotonic() - started

    finals = {o.key: o.answers[-1] for o in outcomes if o.answers and o.answers[-1][1] in FINAL}
    unanswered = [o.key for o in outcomes if o.key not in finals]
    assert not unanswered, f"{len(unanswered)} key(s) never got a final answer"
    server_errors = [a for o in outcomes for a in o.answers if a[1] == 500]
    assert not server_errors, server_errors[:5]
    acknowledged_before_kill = {a[2] for o in outcomes for a in o.answers if a[1] == 201 and a[0] < killed_at}
    stored = set(checked["payments"])
    assert acknowledged_before_kill <= stored, acknowledged_before_kill - stored  # nothing acknowledged was lost
    for outcome in outcomes:  # every answer a key got names the same payment: one effect
        paid = {a[2] for a in outcome.answers if a[1] == 201}
        assert len(paid) <= 1, (outcome.key, paid)
    answered = {a[2] for a in finals.values() if a[1] == 201}
    assert stored == answered, (sorted(stored - answered)[:5], sorted(answered - stored)[:5])  # no payment without its key's answer
    assert reconcile.returncode == 0, reconcile.stdout[-3000:] + reconcile.stderr[-3000:]
    retried = sum(1 for o in outcomes if o.errors or len(o.answers) > 1)
    figures("postgres-failover", requests=sum(len(o.answers) + o.errors for o in outcomes), keys=len(outcomes), faults=1,
            acknowledged_before_kill=len(acknowledged_before_kill), retried=retried, lost=0, doubled=0, seconds=round(seconds, 1))


def _load_through_failover(port: int, terminal_key: str, customers: list[str], primary: Cluster, standby: Cluster, clients: int,
                           before: float, hold: float, after: float) -> tuple[list[Outcome], float]:
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + before + after + 180  # a key in flight is retried until this
    stop_new, threads = clients_start(port, terminal_key, customers, clients=clients, prefix="fo", deadline=deadline, outcomes=outcomes)
    time.sleep(before)
    killed_at = time.monotonic()
    primary.kill()
    standby.promote()
    time.sleep(hold)  # commits wait for the standby the promoted node does not have
    standby.synchronous_standby_drop()
    time.sleep(after)
    stop_new.set()
    for thread in threads:
        thread.join(timeout=200)
    return outcomes, killed_at
