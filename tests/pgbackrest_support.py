"""A PostgreSQL 15 instance the test owns, archiving its WAL to a pgBackRest repository under
the same tmp directory, and what it takes to back it up and restore it to a point in time.

Nothing here copies a file or a WAL segment itself: Debian's `pgbackrest` does every step
(archive-push from `archive_command`, stanza-create, check, backup, restore, info).

`pgbackrest_node_settings` returns, as data, what any node needs: the PostgreSQL parameters
(`archive_mode`, `archive_command`, ...) and the text of its pgbackrest.conf. A Patroni
cluster puts the former in `postgresql.parameters` (every node has them; only the leader
archives: a standby's `archive_mode = on` does nothing) and writes the latter on each node.

Run as the `postgres` user when the tests run as root (initdb refuses root), as tests/pg_pair.py
does; everything lives in a directory of its own under /tmp, which that user can reach."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults import free_port_in
from tests.pg_pair import Cluster, _as_postgres, _bin, _run

STANZA = "tally"
PORTS = range(5470, 5490)  # this suite's loopback ports (the pair's are 5433-5440)


@dataclass(frozen=True)
class NodeSettings:
    """What a node archiving to the repository is given: `parameters` go to postgresql.conf
    (or Patroni's `postgresql.parameters`), `restore_command` to recovery (Patroni's
    `postgresql.recovery_conf`), `conf` is written to `config_path`."""

    config_path: Path
    parameters: dict[str, str]
    restore_command: str
    conf: str


def pgbackrest_parameters(*, config_path: Path | None = None) -> dict[str, str]:
    """The PostgreSQL parameters of a node archiving to the repository. Without `config_path`
    the command names no `--config` (pgBackRest reads /etc/pgbackrest/pgbackrest.conf, or the
    file PGBACKREST_CONFIG names): the same text on every node of a Patroni cluster, each
    node's own pgbackrest.conf holding its `pg1-path` (`archive-push` refuses a `pg1-path`
    that is not the directory PostgreSQL runs it in)."""
    config = f"--config={config_path} " if config_path is not None else ""
    return {
        "wal_level": "replica",
        "archive_mode": "on",
        "archive_command": f"pgbackrest {config}--stanza={STANZA} archive-push %p",
        # A quiet primary still closes a segment a minute: the archive is never more than
        # that behind on idle time (under load segments fill and go much sooner).
        "archive_timeout": "60s",
    }


def pgbackrest_node_settings(
    *, config_path: Path, repo_path: Path, log_path: Path, pg_path: Path, pg_port: int, socket_path: Path,
    retention_full: int = 2, retention_diff: int = 6,
) -> NodeSettings:
    """The settings of one node. Retention counts backups: `retention_full` full backups are
    kept (each with the WAL needed to replay from it); an expired full takes its
    differentials and incrementals with it; `retention_diff` differentials at most."""
    command = f"pgbackrest --config={config_path} --stanza={STANZA}"
    parameters = pgbackrest_parameters(config_path=config_path)
    conf = (
        "[global]\n"
        f"repo1-path={repo_path}\n"
        f"repo1-retention-full={retention_full}\n"
        f"repo1-retention-diff={retention_diff}\n"
        "compress-type=lz4\n"  # cheap on CPU; gz (the default) takes several times longer
        "process-max=2\n"
        "start-fast=y\n"  # a checkpoint now, not at the next scheduled one
        f"log-path={log_path}\n"
        f"lock-path={log_path}\n"
        "log-level-console=warn\n"
        "log-level-file=info\n"
        f"\n[{STANZA}]\n"
        f"pg1-path={pg_path}\n"
        f"pg1-port={pg_port}\n"
        f"pg1-socket-path={socket_path}\n"
        "pg1-user=postgres\n"
    )
    return NodeSettings(config_path=config_path, parameters=parameters, restore_command=f"{command} archive-get %f \"%p\"", conf=conf)


@dataclass
class BackupNode:
    """The instance, its repository and the instances restored from it (stopped with it)."""

    root: Path
    cluster: Cluster
    settings: NodeSettings
    restored: list[Cluster] = field(default_factory=list)

    def pgbackrest(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        argv = ["pgbackrest", f"--config={self.settings.config_path}", f"--stanza={STANZA}", *args]
        done = subprocess.run(_as_postgres(argv), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done

    def backup(self, kind: str) -> float:
        """A `full`, `diff` or `incr` backup; returns its seconds."""
        started = time.monotonic()
        self.pgbackrest(f"--type={kind}", "backup")
        return time.monotonic() - started

    def info(self) -> dict[str, Any]:
        """pgBackRest's own description of the stanza (backups, sizes, WAL range)."""
        stanzas: list[dict[str, Any]] = json.loads(self.pgbackrest("--output=json", "info").stdout)
        return stanzas[0]

    def archive_wait(self) -> None:
        """`check`: switches the WAL segment and waits until pgBackRest has archived it, so a
        restore can replay up to now."""
        self.pgbackrest("check")

    def restore(self, *, target: str | None, name: str) -> tuple[Cluster, float]:
        """Restore the latest backup into a NEW data directory and replay the archived WAL up
        to `target` (a timestamp; None: to the archive's end), then promote; start it on a
        port of its own. Archiving is off on the copy: it must not push a timeline into the
        repository the original still writes. Returns the started copy and the restore's seconds."""
        directory = self.root / name
        directory.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
        recovery = ["--type=time", f"--target={target}", "--target-action=promote"] if target is not None else ["--type=default"]
        started = time.monotonic()
        self.pgbackrest(f"--pg1-path={directory}", "--archive-mode=off", *recovery, "restore")
        restored = Cluster(directory, free_port_in(range(self.cluster.port + 1, PORTS.stop)))
        self.restored.append(restored)
        restored.start()
        # pg_ctl -w returns once it answers, read-only while it replays (hot standby): the
        # copy is done once it has reached the target and promoted.
        while restored.sql("SELECT pg_is_in_recovery()") != "f":
            time.sleep(0.2)
        return restored, time.monotonic() - started


def _initdb(directory: Path, parameters: dict[str, str], port: int) -> None:
    _run([_bin("initdb"), "-D", str(directory), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"])
    base = {"listen_addresses": "'127.0.0.1'", "port": str(port), "unix_socket_directories": f"'{directory}'",
            "shared_buffers": "64MB", "max_connections": "60", "max_wal_size": "1GB", "fsync": "on"}
    quoted = {name: f"'{value}'" for name, value in parameters.items()}
    with (directory / "postgresql.conf").open("a") as conf:
        conf.writelines(f"{name} = {value}\n" for name, value in {**base, **quoted}.items())


@contextmanager
def pgbackrest_node(*, dump_from: str | None = None, ports: range = PORTS) -> Iterator[BackupNode]:
    """Yield a running instance with database `tally` (a pg_dump of `dump_from` loaded into it
    when given), archiving to a stanza that `stanza-create` made and `check` verified. No
    backup yet: the caller takes them. Every instance and file goes at the end."""
    root = Path(tempfile.mkdtemp(prefix="tally-pgbr-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    port = free_port_in(ports)
    pg_path = root / "pg"
    for sub in ("repo", "log"):
        (root / sub).mkdir()
        if os.geteuid() == 0:
            shutil.chown(root / sub, "postgres", "postgres")
    settings = pgbackrest_node_settings(config_path=root / "pgbackrest.conf", repo_path=root / "repo", log_path=root / "log",
                                        pg_path=pg_path, pg_port=port, socket_path=pg_path)
    settings.config_path.write_text(settings.conf)
    node = BackupNode(root=root, cluster=Cluster(pg_path, port), settings=settings)
    try:
        _initdb(pg_path, settings.parameters, port)
        node.cluster.start()
        node.cluster.sql("CREATE DATABASE tally")
        if dump_from is not None:
            dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", "-d", dump_from], check=True, capture_output=True)
            subprocess.run(_as_postgres(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "tally", "-q",
                                         "-v", "ON_ERROR_STOP=1"]), input=dump.stdout, check=True, capture_output=True)
        node.pgbackrest("stanza-create")
        node.pgbackrest("check")
        yield node
    finally:
        for cluster in (*node.restored, node.cluster):
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
