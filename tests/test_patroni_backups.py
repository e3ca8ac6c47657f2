"""WAL archiving follows the leader: a Patroni cluster whose nodes all carry pgBackRest's
settings archives from whichever node leads, before and after a switchover, to one stanza.

The cluster (tests/patroni_cluster.py: etcd, two PostgreSQL 15 nodes under Patroni) gets
`archive_mode`/`archive_command` through the DCS (`extra_parameters`): the same text on every
node, `pgbackrest --stanza=tally archive-push %p`, naming no config file. Each node has a
pgbackrest.conf of its own (its `pg1-path`, `pg1-port`, socket; the one repository, which on
one host both nodes reach, as a shared mount or an object store would be on several), and
its Patroni, so its PostgreSQL, is started with PGBACKREST_CONFIG naming it: as
/etc/pgbackrest/pgbackrest.conf on a machine of its own.

On the first leader: `stanza-create`, `check`, a full backup. Then `patronictl switchover` to
the replica. On the new leader: `check` (it switches the WAL segment and waits until the
repository has it: the new leader's `archive_command` works end to end), `pg_stat_archiver`
counts segments archived there on the new timeline, `pgbackrest info` shows the archive's
range grew onto that timeline, and an incremental backup is taken from it on top of the
first leader's full.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any

import pytest

from tests.faults import figures, until
from tests.patroni_cluster import Node, patroni_cluster
from tests.pg_pair import _as_postgres
from tests.pgbackrest_support import STANZA, pgbackrest_node_settings, pgbackrest_parameters

pytestmark = pytest.mark.proof  # 30 s: in `make test` as in `make proof`


def _node_env(node: Node) -> dict[str, str]:
    """The node's pgbackrest.conf, written next to its data directory; the one repository
    beside the nodes."""
    repo, log = node.directory.parent / "pgbackrest-repo", node.directory / "pgbackrest-log"
    for directory in (repo, log):
        directory.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
    settings = pgbackrest_node_settings(config_path=node.directory / "pgbackrest.conf", repo_path=repo, log_path=log,
                                        pg_path=node.data, pg_port=node.pg_port, socket_path=node.directory)
    settings.config_path.write_text(settings.conf)
    return {"PGBACKREST_CONFIG": str(settings.config_path)}


def _pgbackrest(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    """pgBackRest as the node's own `postgres` user runs it: its config, its PostgreSQL."""
    argv = ["pgbackrest", f"--config={node.env['PGBACKREST_CONFIG']}", f"--stanza={STANZA}", *args]
    done = subprocess.run(_as_postgres(argv), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} on {node.name} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def _info(node: Node) -> dict[str, Any]:
    stanzas: list[dict[str, Any]] = json.loads(_pgbackrest(node, "--output=json", "info").stdout)
    return stanzas[0]


def _archiver(node: Node) -> tuple[int, str, int]:
    """(archived_count, last_archived_wal, failed_count) of the node's `pg_stat_archiver`."""
    done = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(node.pg_port), "-U", "postgres", "-d", "postgres", "-XAt", "-F", " ", "-c",
                           "SELECT archived_count, coalesce(last_archived_wal, '-'), failed_count FROM pg_stat_archiver"],
                          capture_output=True, text=True, check=True, timeout=30)
    archived, last, failed = done.stdout.split()
    return int(archived), last, int(failed)


def test_wal_is_archived_from_whichever_node_leads_and_a_backup_taken_from_the_new_leader() -> None:
    started = time.monotonic()
    with patroni_cluster(nodes=2, extra_parameters=pgbackrest_parameters(), node_env=_node_env) as cluster:
        first = cluster.leader_wait()
        cluster.sql("CREATE TABLE archive_drill (at timestamptz NOT NULL DEFAULT now())")
        cluster.sql("INSERT INTO archive_drill SELECT FROM generate_series(1, 1000)")
        _pgbackrest(first, "stanza-create")
        _pgbackrest(first, "check")
        full_started = time.monotonic()
        _pgbackrest(first, "--type=full", "backup")
        full_seconds = time.monotonic() - full_started
        archive_before = _info(first)["archive"][0]["max"]

        candidate = cluster.synchronous_wait()
        switch_started = time.monotonic()
        switched = cluster.switchover(candidate=candidate)
        assert switched.returncode == 0, switched.stdout + switched.stderr
        until(lambda: cluster.leader() is candidate, "the candidate to lead", seconds=90, poll=0.3, why=cluster.logs)
        switch_seconds = time.monotonic() - switch_started
        new = candidate

        cluster.sql("INSERT INTO archive_drill SELECT FROM generate_series(1, 1000)")
        _pgbackrest(new, "check")  # a segment switched on the new leader, and in the repository
        archived, last_archived, failed = _archiver(new)
        archive_after = _info(new)["archive"][0]["max"]
        incr_started = time.monotonic()
        _pgbackrest(new, "--type=incr", "backup")
        incr_seconds = time.monotonic() - incr_started
        backups = _info(new)["backup"]
        old_role = cluster.nodes[0].api("/cluster")[1]
    seconds = time.monotonic() - started

    timeline = archive_before[:8]
    assert archived > 0 and failed == 0, (archived, last_archived, failed)
    assert last_archived[:8] > timeline, (last_archived, archive_before)  # archived by the new leader, on its timeline
    assert archive_after > archive_before and archive_after[:8] == last_archived[:8], (archive_before, archive_after)
    assert [b["type"] for b in backups] == ["full", "incr"], backups
    assert backups[1]["prior"] == backups[0]["label"]  # the new leader's incremental builds on the first leader's full
    assert {m["name"]: m["role"] for m in old_role["members"]}[first.name] in ("replica", "sync_standby")
    figures("patroni-archive", full_s=round(full_seconds, 1), switchover_s=round(switch_seconds, 1), incr_s=round(incr_seconds, 1),
            archive_before=archive_before, archive_after=archive_after, archived_on_new_leader=archived, seconds=round(seconds, 1))
