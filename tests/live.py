"""A real gunicorn on the test database, served as `make run` serves it, for tests that
must cross a socket (chunked bodies, gunicorn's own errors, static files, schemathesis
from outside, the browser test). Rows it should see must be committed (`live_tenant`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def static_collect(*, static_root: Path) -> None:
    """`manage.py collectstatic` into `static_root`, as `make run` does into var/static."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "TALLY_STATIC_ROOT": str(static_root)}
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def live_redis_env() -> dict[str, str]:
    """REDIS_URL and CELERY_BROKER_URL as this process has them: this xdist worker's own Redis
    database (config/settings/test.py). A server on config.settings.local would otherwise
    read the base REDIS_URL from the environment, one database for both workers' servers,
    under the same schema names (throttle windows, API key epochs), and not the one this
    process's services bump."""
    return {"REDIS_URL": str(settings.REDIS_URL), "CELERY_BROKER_URL": str(settings.CELERY_BROKER_URL)}


@contextmanager
def gunicorn_running(
    *, workers: int = 1, static_root: Path | None = None, log: Path | None = None, port: int | None = None, **extra_env: str
) -> Iterator[int]:
    """gunicorn (config/gunicorn.py) on `port` (default: a free one) against the test database;
    yields the port once it answers /healthz. With `static_root`, static files come from there
    only (collected, no finders), as in production."""
    port = port or free_port()
    database = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.local", "DJANGO_DEBUG": "false", "TALLY_LOG_LEVEL": "WARNING",
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}",
        "PORT": str(port), "WEB_CONCURRENCY": str(workers), "TENANT_CACHE_SECONDS": "0", "TALLY_OUTBOX_RELAY_KICK": "false",
        **live_redis_env(), **extra_env,
    }
    if static_root is not None:
        env.update(TALLY_STATIC_ROOT=str(static_root), TALLY_STATIC_USE_FINDERS="false")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py")],
        cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("gunicorn did not start") from None
                time.sleep(0.2)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=20)
        if log is not None:
            out.close()  # type: ignore[union-attr]
