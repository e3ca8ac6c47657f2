"""A Patroni cluster the test owns: one etcd member (Debian's etcd-server, v3 API) and two or
three PostgreSQL 15 nodes under Patroni (PyPI, pinned in requirements-dev.txt), each on
loopback ports of its own in 5450-5469, everything under a directory of its own in /tmp.
Patroni and PostgreSQL run as the `postgres` user when the tests run as root (initdb
refuses root), as tests/pg_pair.py does.

The cluster runs in synchronous mode, not strict (`synchronous_mode: true`,
`synchronous_mode_strict: false`): while a replica is attached, a commit returns only once it
has the commit, and Patroni only promotes the replica it lists as synchronous, so no
acknowledged commit is lost in a failover. With two nodes, strict mode would stop every write
while the one replica is away (a replica's loss would be an outage of its own); not strict,
Patroni lets the leader commit alone once it has seen the replica go (a loop, 2 s here) and
names it synchronous again when it is back. `primary_start_timeout: 0`: a leader whose
PostgreSQL crashed is failed over at once rather than restarted in place (safe in synchronous
mode: the replica Patroni promotes has every acknowledged commit).

`extra_parameters` (PostgreSQL settings every node gets through the DCS, e.g.
`archive_mode`/`archive_command`) is the hook for what a backup tool needs on whichever node
leads; `node_env` (called once per node, before it starts) returns environment variables for
that node's Patroni, which its PostgreSQL and so its `archive_command` inherit: what differs
by node, e.g. PGBACKREST_CONFIG naming the node's own pgbackrest.conf, as
/etc/pgbackrest/pgbackrest.conf does on a machine of its own."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tests.faults import until
from tests.pg_pair import _alive, postmaster_and_backends_kill

PG_BIN = Path("/usr/lib/postgresql/15/bin")
VENV_BIN = Path(sys.executable).parent
SCOPE = "tally"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 2, 5  # Patroni's minimum TTL is 20 s; loop_wait + 2 * retry_timeout <= ttl


def ports_of_worker() -> range:
    """Ten ports per pytest-xdist worker (gw0: 5450-5459, gw1: 5460-5469), so two clusters
    started at once never race for a port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    start = 5450 + 10 * (n % 2)
    return range(start, start + 10)


def _as_postgres() -> dict[str, Any]:
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


def _patroni_command() -> tuple[list[str], dict[str, str]]:
    """How to start Patroni, and the environment it needs. As root it runs as `postgres`,
    who may not reach the venv's interpreter (a pyenv build under /root): then the system's
    interpreter of the same version runs it, with the venv's site-packages on its path."""
    interpreter = os.path.realpath(sys.executable)
    env = dict(os.environ)
    if os.geteuid() == 0:
        reachable = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", interpreter], check=False).returncode == 0
        if not reachable:
            interpreter = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin") or ""
            if not interpreter:
                raise RuntimeError("no Python the postgres user can run Patroni with")
            env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    env["HOME"] = tempfile.gettempdir()
    # -S: not the system's dist-packages (its pyOpenSSL does not match the venv's cryptography).
    return [interpreter, *(["-S"] if "PYTHONPATH" in env else []), "-c", "import sys; from patroni.__main__ import main; sys.exit(main())"], env


class Node:
    def __init__(self, root: Path, name: str, pg_port: int, api_port: int, etcd_port: int, parameters: dict[str, str]) -> None:
        self.name, self.pg_port, self.api_port = name, pg_port, api_port
        self.directory = root / name
        self.data = self.directory / "data"
        self.config = self.directory / "patroni.yml"
        self.log = self.directory / "patroni.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.directory.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        config = {
            "scope": SCOPE, "name": name, "namespace": "/service/",
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{api_port}", "connect_address": f"127.0.0.1:{api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{etcd_port}"], "protocol": "http"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576, "primary_start_timeout": 0,
                    "synchronous_mode": True, "synchronous_mode_strict": False,
                    "postgresql": {
                        "use_pg_rewind": True, "use_slots": True,
                        "parameters": {
                            "wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on", "synchronous_commit": "on",
                            "max_wal_senders": 10, "max_replication_slots": 10, "max_connections": 80,
                            "shared_buffers": "32MB", "wal_keep_size": "256MB", "fsync": "on", **parameters,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{pg_port}", "connect_address": f"127.0.0.1:{pg_port}",
                "data_dir": str(self.data), "bin_dir": str(PG_BIN), "pgpass": str(self.directory / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"}, "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": {"unix_socket_directories": str(self.directory)},
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust", "host replication postgres 127.0.0.1/32 trust"],
            },
        }
        # JSON is YAML: Patroni reads it as its configuration file.
        self.config.write_text(json.dumps(config, indent=1))

    def start(self) -> None:
        with self.log.open("ab") as out:
            argv, env = _patroni_command()
            env.update(self.env)
            self.process = subprocess.Popen([*argv, str(self.config)], stdout=out, stderr=subprocess.STDOUT, cwd=self.directory,
                                            env=env, start_new_session=True, **_as_postgres())

    def patroni_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def api(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=2) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")
        except (OSError, ValueError):
            return 0, {}

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError, PermissionError):
            return None

    def postmaster_kill(self) -> None:
        """SIGKILL to the postmaster and every backend, as when PostgreSQL crashes hard."""
        pid = self.postmaster_pid()
        if pid is not None and _alive(pid):
            postmaster_and_backends_kill(pid, what=f"{self.name}'s postgres processes")

    def patroni_kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def machine_kill(self) -> None:
        """Patroni and PostgreSQL SIGKILLed together, as when the node's machine dies."""
        self.patroni_kill()
        self.postmaster_kill()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # Patroni stops its PostgreSQL (fast) and leaves
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.postmaster_kill()


class PatroniCluster:
    def __init__(self, root: Path, ports: range, nodes: int, parameters: dict[str, str]) -> None:
        self.root = root
        port = iter(ports)
        self.etcd_port, self.etcd_peer_port = next(port), next(port)
        pg_ports = [next(port) for _ in range(nodes)]
        api_ports = [next(port) for _ in range(nodes)]
        self.haproxy_port = next(port)
        self.spare_ports = list(port)  # for the test's own Redis and gunicorn
        self.nodes = [Node(root, f"node{n + 1}", pg_ports[n], api_ports[n], self.etcd_port, parameters) for n in range(nodes)]
        self.etcd: subprocess.Popen[bytes] | None = None

    # -- etcd --
    def etcd_start(self) -> None:
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        with (self.root / "etcd.log").open("ab") as out:
            self.etcd = subprocess.Popen(
                ["etcd", "--name", "etcd1", "--data-dir", str(self.root / "etcd"), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new", "--enable-v2=false"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as answer:
                    return bool(json.loads(answer.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        until(healthy, "etcd to answer", seconds=30, poll=0.2)

    # -- what the tests ask --
    def database_url(self, database: str = "tally") -> str:
        hosts = ",".join(f"127.0.0.1:{node.pg_port}" for node in self.nodes)
        return f"postgres://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def leader(self) -> Node | None:
        """The node whose REST API answers 200 on /primary: it holds the leader key and runs
        PostgreSQL as a primary."""
        for node in self.nodes:
            if node.api("/primary")[0] == 200:
                return node
        return None

    def leader_wait(self, seconds: float = 90) -> Node:
        found: Node = until(self.leader, "a leader", seconds=seconds, poll=0.3, why=self.logs)
        return found

    def replicas(self) -> list[Node]:
        leader = self.leader()
        return [node for node in self.nodes if node is not leader]

    def synchronous_wait(self, seconds: float = 90) -> Node:
        """Wait for a synchronous replica streaming from the leader; returns that replica."""
        def synchronous() -> Node | None:
            status, cluster = self.nodes[0].api("/cluster")
            for member in cluster.get("members", []) if status == 200 else []:
                if member.get("role") == "sync_standby" and member.get("state") == "streaming":
                    return self.node(member["name"])
            return None

        found: Node = until(synchronous, "a synchronous replica streaming", seconds=seconds, poll=0.3, why=self.logs)
        return found

    def patronictl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VENV_BIN / "patronictl"), "-c", str(self.nodes[0].config), *args], capture_output=True, text=True,
                              timeout=120, check=False)

    def switchover(self, *, candidate: Node) -> subprocess.CompletedProcess[str]:
        leader = self.leader_wait()
        return self.patronictl("switchover", SCOPE, "--leader", leader.name, "--candidate", candidate.name, "--force")

    def sql(self, statement: str, database: str = "postgres") -> str:
        with psycopg.connect(self.database_url(database), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement.encode())
            row = cursor.fetchone() if cursor.description else None
            return "" if row is None else str(row[0])

    def load(self, dump_from: str, database: str = "tally") -> None:
        """The test database copied (pg_dump) into `database` on the leader, as tests/pg_pair.py
        loads its pair; the replica gets it by streaming."""
        leader = self.leader_wait()
        self.sql(f"CREATE DATABASE {database}")
        dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", "-d", dump_from], check=True, capture_output=True)
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(leader.pg_port), "-U", "postgres", "-d", database, "-q", "-v",
                        "ON_ERROR_STOP=1"], input=dump.stdout, check=True, capture_output=True)

    @contextmanager
    def haproxy(self) -> Iterator[str]:
        """HAProxy with the shipped configuration (devtools/ops/haproxy.cfg, two nodes) in front
        of the cluster; yields the libpq URL of its one address."""
        config = Path(__file__).resolve().parent.parent / "devtools" / "ops" / "haproxy.cfg"
        env = {**os.environ, "HAPROXY_BIND": f"127.0.0.1:{self.haproxy_port}"}
        for n, node in enumerate(self.nodes[:2], start=1):
            env.update({f"NODE{n}": f"127.0.0.1:{node.pg_port}", f"NODE{n}_API": str(node.api_port)})
        with (self.root / "haproxy.log").open("ab") as out:
            process = subprocess.Popen(["haproxy", "-db", "-f", str(config)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        try:
            yield f"postgres://postgres@127.0.0.1:{self.haproxy_port}/postgres"
        finally:
            process.kill()
            process.wait()

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {node.name}\n{node.log.read_text(errors='replace')[-tail:]}" for node in self.nodes if node.log.exists())

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.kill()
            self.etcd.wait()


class WriteProbe:
    """Writes through the cluster's multi-host URL (target_session_attrs=read-write) every
    100 ms, each on a fresh connection as a client after a failover connects: a write counts
    when its commit returns within 2 s with no warning (a commit cancelled while it waits for
    the synchronous replica is reported as committed with a warning: not a writable
    primary). `longest_gap()` is the longest stretch without such a write, in seconds: the
    time without a writable primary."""

    def __init__(self, cluster: PatroniCluster) -> None:
        self.url = cluster.database_url("postgres")
        self.successes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS write_probe (at timestamptz NOT NULL DEFAULT now())")

    def _write(self) -> bool:
        warned: list[str] = []
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=1, options="-c statement_timeout=2000") as conn:
                conn.add_notice_handler(lambda notice: warned.append(str(notice.message_primary)))
                conn.execute("INSERT INTO write_probe DEFAULT VALUES")
        except psycopg.Error:
            return False
        return not warned

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._write():
                self.successes.append(time.monotonic())
            self._stop.wait(0.1)

    def __enter__(self) -> WriteProbe:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.stopped = time.monotonic()

    def longest_gap(self, after: float | None = None) -> float:
        marks = [self.started, *self.successes, getattr(self, "stopped", time.monotonic())]
        if after is not None:
            marks = [m for m in marks if m >= after]
            marks.insert(0, max([m for m in [self.started, *self.successes] if m < after], default=self.started))
        return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)


@contextmanager
def patroni_cluster(*, nodes: int = 2, dump_from: str | None = None, extra_parameters: dict[str, str] | None = None,
                    node_env: Callable[[Node], dict[str, str]] | None = None) -> Iterator[PatroniCluster]:
    """Yield a running cluster: etcd, `nodes` Patroni nodes, a leader and a synchronous replica
    streaming; with `dump_from` (a libpq URL), that database copied into `tally`."""
    root = Path(tempfile.mkdtemp(prefix="tally-patroni-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = PatroniCluster(root, ports_of_worker(), nodes, extra_parameters or {})
    try:
        for node in cluster.nodes:
            node.env = node_env(node) if node_env is not None else {}
        cluster.etcd_start()
        cluster.nodes[0].start()  # the first bootstraps (initdb); the others then clone it
        cluster.leader_wait()
        for node in cluster.nodes[1:]:
            node.start()
        cluster.synchronous_wait()
        if dump_from is not None:
            cluster.load(dump_from)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
