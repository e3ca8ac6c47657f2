"""`make run`'s processes under keyed payments, each killed with SIGKILL in turn: a gunicorn
worker, the whole web server, the Celery worker and the PSP simulator. They run from the
Procfile under supervisord (devtools.procfile) as `make run` runs them, on the test database
and a Redis of the test's own. Supervisor (or gunicorn's master, for its worker) starts each
again, the others keep serving, clients send each unanswered key again until a final
answer, and afterwards: one payment per key, none without its key's answer, no 500, every
outbox event relayed, reconciliation clean. A Redis outage follows the kills in each round:
payments answer 201 or 503 through it and no process exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from devtools.procfile import procfile_read
from tests.faults import ROOT, OwnRedis, figures, own_redis, until
from tests.live import free_port
from tests.test_failover import FINAL, Outcome, _app, clients_start, ledger_reconcile

pytestmark = [pytest.mark.proof]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[OwnRedis]:
    with own_redis(tmp_path) as server:
        yield server


def _descendants(root: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process under `root`."""
    table: list[tuple[int, int, str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(") ", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        table.append((int(entry), parent, command))
    found, frontier = [], {root}
    while frontier:
        children = [row for row in table if row[1] in frontier]
        found += children
        frontier = {row[0] for row in children}
    return found


def _one(root: int, test: Callable[[int, int, str], bool], what: str) -> int:
    def find() -> int | None:
        matches = [pid for pid, parent, command in _descendants(root) if test(pid, parent, command)]
        return matches[0] if matches else None

    pid: int = until(find, what, seconds=60, poll=0.2)
    return pid


def test_a_process_killed_under_payments_comes_back_and_nothing_is_lost_or_doubled(
    django_db_setup: None, redis_server: OwnRedis, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    long = request.config.getoption("--long")
    clients, rounds = (4, 2) if long else (2, 1)
    settings = connection.settings_dict
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    web_port, psp_port = free_port(), free_port()
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING",
        DATABASE_URL=f"postgres://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}",
        REDIS_URL=redis_server.url, CELERY_BROKER_URL=redis_server.url, PORT=str(web_port), WEB_CONCURRENCY="2",
        TALLY_PSP_PORT=str(psp_port), TENANT_CACHE_SECONDS="0", VENV_BIN=str(Path(sys.executable).parent),
    )
    seeded = _app(env, "seed", str(tmp_path / "keys.json"), "100")
    seeded_file = tmp_path / "seeded.json"
    seeded_file.write_text(json.dumps(seeded))
    terminal_key, customers = seeded["keys"]["terminal"], seeded["customers"]
    # The Procfile's processes but the receiver (no endpoint here); the simulator's accounts
    # file in the test's directory, not var/.
    procfile = tmp_path / "Procfile"
    procfile.write_text("".join(
        f"{e.name}: {e.command.replace('var/psp_simulator.json', str(tmp_path / 'psp.json'))}\n"
        for e in procfile_read(ROOT / "Procfile") if e.name != "receiver"
    ))
    (tmp_path / "psp.json").write_text("{}")
    log = tmp_path / "supervisor.log"
    code = ("import sys; from pathlib import Path; from devtools.procfile import procfile_read, processes_run; "
            f"sys.exit(processes_run(procfile_read(Path({str(procfile)!r})), cwd=Path({str(ROOT)!r})))")
    with log.open("wb") as out:
        runner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    outcomes: list[Outcome] = []
    faults: list[str] = []
    try:
        is_master = lambda pid, parent, cmd: "gunicorn" in cmd and "config.wsgi" in cmd and not _is_gunicorn(parent)  # noqa: E731
        master = _one(runner.pid, is_master, "gunicorn's master")
        _one(runner.pid, lambda pid, parent, cmd: parent == master, "a gunicorn worker")
        until(lambda: "ready." in log.read_text(errors="replace") or "celery@" in log.read_text(errors="replace"), "the worker", seconds=60)
        time.sleep(2)
        stop_new, threads = clients_start(web_port, terminal_key, customers, clients=clients, prefix="sk", deadline=time.monotonic() + 300,
                                          outcomes=outcomes)
        for _ in range(rounds):
            time.sleep(3)
            master = _one(runner.pid, is_master, "gunicorn's master")
            worker = _one(runner.pid, lambda pid, parent, cmd, m=master: parent == m, "a gunicorn worker")
            os.kill(worker, signal.SIGKILL)
            faults.append("gunicorn worker")
            time.sleep(3)
            os.killpg(os.getpgid(master), signal.SIGKILL)  # the master and its workers: supervisord starts web again
            faults.append("gunicorn")
            _one(runner.pid, lambda pid, parent, cmd, m=master: _is_gunicorn_master(pid, cmd) and pid != m, "web started again")
            time.sleep(3)
            celery = _one(runner.pid, lambda pid, parent, cmd: "celery" in cmd and " worker " in cmd and not _is_celery(parent), "the Celery worker")
            os.kill(celery, signal.SIGKILL)
            faults.append("celery worker")
            _one(runner.pid, lambda pid, parent, cmd, c=celery: "celery" in cmd and " worker " in cmd and pid != c and not _is_celery(parent),
                 "the Celery worker started again")
            psp = _one(runner.pid, lambda pid, parent, cmd: "psp_simulator" in cmd, "the PSP simulator")
            os.kill(psp, signal.SIGKILL)
            faults.append("psp simulator")
            _one(runner.pid, lambda pid, parent, cmd, p=psp: "psp_simulator" in cmd and pid != p, "the PSP simulator started again")
            time.sleep(2)
            redis_server.stop()  # a Redis outage under the same payments: answers 201 or 503, nothing exits
            time.sleep(2)
            redis_server.start()
            faults.append("redis outage")
        time.sleep(3)
        stop_new.set()
        for thread in threads:
            thread.join(timeout=300)
        until(lambda: _app(env, "check", str(seeded_file))["events_unpublished"] == 0, "every outbox event to be relayed", seconds=120, poll=2,
              why=lambda: log.read_text(errors="replace")[-3000:])
        checked = _app(env, "check", str(seeded_file))
    finally:
        runner.send_signal(signal.SIGTERM)
        try:
            runner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            runner.kill()
    supervised = log.read_text(errors="replace")
    for name in ("web", "worker", "psp"):
        assert f"exited: {name} (" in supervised, supervised[-3000:]
    before_stop = supervised.split("received SIGTERM")[0]
    assert "exited: beat (" not in before_stop  # never killed, and the Redis outage ended nothing
    for name in ("web", "worker", "psp"):  # each exited once a round: killed, never of the outage
        assert before_stop.count(f"exited: {name} (") == rounds, before_stop[-3000:]
    finals = {o.key: o.answers[-1] for o in outcomes if o.answers and o.answers[-1][1] in FINAL}
    assert len(finals) == len(outcomes), f"{len(outcomes) - len(finals)} key(s) never got a final answer"
    assert not [a for o in outcomes for a in o.answers if a[1] == 500]
    for outcome in outcomes:
        assert len({a[2] for a in outcome.answers if a[1] == 201}) <= 1, outcome
    answered = {a[2] for a in finals.values() if a[1] == 201}
    unanswered = [o for o in outcomes if finals[o.key][1] != 201]
    assert set(checked["payments"]) == answered, (set(checked["payments"]) - answered, answered - set(checked["payments"]), unanswered)
    reconcile = ledger_reconcile(env)
    assert reconcile.returncode == 0, reconcile.stdout[-3000:] + reconcile.stderr[-3000:]
    figures("processes-killed", requests=sum(len(o.answers) + o.errors for o in outcomes), keys=len(outcomes), faults=len(faults),
            retried=sum(1 for o in outcomes if o.errors or len(o.answers) > 1), lost=0, doubled=0)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def _is_gunicorn(pid: int) -> bool:
    return "gunicorn" in _cmdline(pid)


def _is_gunicorn_master(pid: int, cmd: str) -> bool:
    return "gunicorn" in cmd and "config.wsgi" in cmd and not _is_gunicorn(_parent(pid))


def _is_celery(pid: int) -> bool:
    return "celery" in _cmdline(pid)


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(") ", 1)[1].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return 0
