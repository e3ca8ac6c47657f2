"""A PgBouncer in session mode in front of the local PostgreSQL, for running `make run`,
`make test` or one test through a pooler (docs/SCALING.md).

    .venv/bin/python -m devtools.pgbouncer --port 6432      # foreground; Ctrl-C stops it
    DATABASE_URL=postgres://postgres@127.0.0.1:6432/tally make test

Every database name is passed through (`* =` in [databases]), so the test databases that
pytest-django and pytest-xdist name on the fly need no entry. Clients are trusted, as the
local PostgreSQL trusts them; the admin console (database `pgbouncer`) answers SHOW POOLS
and SHOW STATS to the user `postgres`. Session mode keeps one server session per client
session, so the tenant's search_path and the prepared statements (fastpath.prepared) stay
where they were set; transaction mode would not (docs/SCALING.md).

PgBouncer refuses to run as root: as root it is started with `-u postgres`, and its
directory is given to that user.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BINARY = "/usr/sbin/pgbouncer"


def pgbouncer_config_write(
    *, directory: Path, port: int, upstream_host: str = "127.0.0.1", upstream_port: int = 5432,
    pool_mode: str = "session", pool_size: int = 60,
) -> Path:
    """Write pgbouncer.ini and its user list into `directory`; the ini's path.

    `pool_size` server sessions per database and user: the suite's thread races each hold
    a connection (a session-mode client keeps its server session until it disconnects), so
    the pool must not be what makes them wait."""
    directory.mkdir(parents=True, exist_ok=True)
    users = directory / "userlist.txt"
    users.write_text('"postgres" ""\n')  # auth_type trust still needs the name listed
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        "\n".join([
            "[databases]",
            f"* = host={upstream_host} port={upstream_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {users}",
            "admin_users = postgres",
            "stats_users = postgres",
            f"pool_mode = {pool_mode}",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 500",
            # Session mode: what a client set on its session (search_path, PREPAREd
            # statements) is wiped before the server session serves another client.
            "server_reset_query = DISCARD ALL",
            f"logfile = {directory / 'pgbouncer.log'}",
            f"pidfile = {directory / 'pgbouncer.pid'}",
            "log_connections = 1",
            "log_disconnections = 1",
            "",
        ])
    )
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
        for path in (users, ini):
            shutil.chown(path, "postgres", "postgres")
    return ini


def pgbouncer_argv(ini: Path, *, daemon: bool = False) -> list[str]:
    if not Path(BINARY).exists():
        raise SystemExit(f"{BINARY} not found: `make pgbouncer` installs Debian's pgbouncer")
    argv = [BINARY]
    if daemon:
        argv.append("-d")
    if os.geteuid() == 0:
        argv += ["-u", "postgres"]
    return [*argv, str(ini)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="PgBouncer (session mode) in front of a local PostgreSQL, in the foreground")
    parser.add_argument("--port", type=int, default=6432)
    parser.add_argument("--upstream-port", type=int, default=5432)
    parser.add_argument("--pool-mode", default="session", choices=["session", "transaction"])
    parser.add_argument("--dir", type=Path, default=None, help="where its ini, user list and log go (default: a new /tmp directory)")
    args = parser.parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="tally-pgbouncer-"))
    ini = pgbouncer_config_write(directory=directory, port=args.port, upstream_port=args.upstream_port, pool_mode=args.pool_mode)
    print(f"pgbouncer: {ini}; DATABASE_URL=postgres://postgres@127.0.0.1:{args.port}/tally", flush=True)
    try:
        return subprocess.call(pgbouncer_argv(ini))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
