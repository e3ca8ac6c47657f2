"""A real gunicorn on the test database, for tests that must cross a socket (chunked
bodies, gunicorn's own errors, schemathesis from outside). Rows it should see must be
committed (`live_tenant`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def gunicorn_running(*, workers: int = 1, **extra_env: str) -> Iterator[int]:
    """Start `config/gunicorn.py` on a free port against this test run's database; yield the port."""
    port = free_port()
    database = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING",
        DATABASE_URL=f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}",
        PORT=str(port), WEB_CONCURRENCY=str(workers), TENANT_CACHE_SECONDS="0", TALLY_OUTBOX_RELAY_KICK="false",
    )
    env.update(extra_env)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"gunicorn exited with {server.returncode}") from None
                time.sleep(0.2)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=20)
