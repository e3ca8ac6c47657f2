"""A PostgreSQL primary and a synchronous standby the test owns: `initdb`, then
`pg_basebackup -R`, both on loopback ports of their own (5433-5440), under the test's tmp
directory. The primary can be killed with SIGKILL (every process of it, as a machine that
died) and the standby promoted. Run as the `postgres` user when the tests run as root
(initdb refuses root)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.faults import free_port_in, until

STANDBY_NAME = "standby1"


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def _bin(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/lib/postgresql/15/bin")
    if found is None:
        raise RuntimeError(f"{name} not found: the failover test needs PostgreSQL's server binaries")
    return found


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_as_postgres(argv), check=True, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


class Cluster:
    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port

    def start(self) -> None:
        _run([_bin("pg_ctl"), "-D", str(self.directory), "-l", str(self.directory / "server.log"), "-w", "-t", "60",
              "-o", f"-p {self.port} -k {self.directory}", "start"])

    def sql(self, statement: str, database: str = "postgres") -> str:
        result = _run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database, "-Atqc", statement])
        return result.stdout.strip()

    def postmaster_pid(self) -> int | None:
        pidfile = self.directory / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL to the postmaster and every backend, as when its machine dies."""
        pid = self.postmaster_pid()
        if pid is not None:
            postmaster_and_backends_kill(pid, what="the killed cluster's processes")

    def promote(self) -> None:
        _run([_bin("pg_ctl"), "-D", str(self.directory), "-w", "-t", "60", "promote"])

    def synchronous_standby_drop(self) -> None:
        """The failover procedure's second step (docs/RELIABILITY.md): the promoted node has
        no standby yet, so it stops waiting for one; commits are then durable on it alone
        until a new standby is attached and the setting restored."""
        self.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        self.sql("SELECT pg_reload_conf()")

    def stop(self) -> None:
        if self.postmaster_pid() is not None and (self.directory / "postmaster.pid").exists():
            subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.directory), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, check=False)


def postmaster_and_backends_kill(pid: int, *, what: str) -> None:
    """SIGKILL to a postmaster and every process it started, then wait until they are gone."""
    victims = [pid, *_children(pid)]
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    until(lambda: not any(_alive(v) for v in victims), f"{what} to go", seconds=20)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(") ", 1)[1].split()[1]) == parent:
                        found.append(int(entry))
            except (FileNotFoundError, IndexError, ValueError):
                continue
    return found


@contextmanager
def pg_pair(*, dump_from: str | None = None) -> Iterator[tuple[Cluster, Cluster]]:
    """Yield (primary, standby), the standby streaming and synchronous: a commit returns only
    once the standby has flushed it (synchronous_commit = on, synchronous_standby_names).
    `dump_from`: a libpq URL whose database is copied (pg_dump) into database `tally` before
    the standby is made. Everything lives in a directory of its own under /tmp, which the
    `postgres` user can reach (pytest's tmp_path is root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="tally-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    primary = Cluster(root / "primary", free_port_in(range(5433, 5441)))
    _run([_bin("initdb"), "-D", str(primary.directory), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"])
    with (primary.directory / "postgresql.conf").open("a") as conf:
        conf.write(
            "listen_addresses = '127.0.0.1'\nwal_level = replica\nmax_wal_senders = 5\nfsync = on\nsynchronous_commit = on\n"
            "shared_buffers = 32MB\nmax_connections = 60\nwal_keep_size = 256MB\n"
        )
    with (primary.directory / "pg_hba.conf").open("a") as hba:
        hba.write("host replication postgres 127.0.0.1/32 trust\n")
    primary.start()
    standby: Cluster | None = None
    try:
        primary.sql("CREATE DATABASE tally")
        if dump_from is not None:
            dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", "-d", dump_from], check=True, capture_output=True)
            subprocess.run(_as_postgres(["psql", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-d", "tally", "-q",
                                         "-v", "ON_ERROR_STOP=1"]), input=dump.stdout, check=True, capture_output=True)
        # Set before the base backup, so the standby has it too, as nodes built from one
        # configuration do: promoted, it waits for a standby of its own until told not to.
        primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        primary.sql("SELECT pg_reload_conf()")
        standby = Cluster(root / "standby", free_port_in(range(primary.port + 1, 5441)))
        _run([_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-D", str(standby.directory),
              "-R", "-X", "stream", "-c", "fast", "-d", f"application_name={STANDBY_NAME}"])
        standby.start()
        until(lambda: primary.sql("SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'") == "sync",
              "the standby to stream, synchronously", seconds=60)
        yield primary, standby
    finally:
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
