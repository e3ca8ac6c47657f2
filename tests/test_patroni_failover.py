"""Patroni fails PostgreSQL over on its own, under keyed payments, and loses no acknowledged
payment and doubles none; Tally is unchanged (libpq's multi-host DATABASE_URL with
target_session_attrs=read-write).

Each test builds its own cluster (tests/patroni_cluster.py: etcd, two PostgreSQL 15 nodes
under Patroni in synchronous mode) with the test database copied in, and runs gunicorn, the
Celery worker and beat as `make run` runs them (tests/test_failover.py's machinery), with a
Redis of their own. Clients send keyed payments, each key sent again until a final answer,
while a probe writes through the same URL every 100 ms (the longest stretch without a write
is the time without a writable primary). The fault, one per test:

1. the leader's postmaster SIGKILLed (every process of it): Patroni promotes the synchronous
   replica (`primary_start_timeout: 0`) and rejoins the old leader as a replica;
2. the leader's Patroni SIGKILLed, and started again 5 s later, as a service manager
   restarts it: PostgreSQL never stopped and the restarted Patroni keeps the leader key;
3. a planned `patronictl switchover` to the replica;
4. the replica's machine lost (Patroni and PostgreSQL SIGKILLed) and brought back 8 s later;
5. the leader's machine lost (Patroni and PostgreSQL SIGKILLed together): the replica takes
   the key once its lease expires (ttl), and the old leader, started again, follows it.

Then: every payment answered 201 is on the leader once, no key has two payments, no payment
lacks its key's answer, no request got a 500, beat sweeps again, every outbox event is relayed and
`manage.py reconcile` finds nothing. `make test` runs a short form of 1; `make proof` all five.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.faults import OwnRedis, celery_beat, celery_worker, figures, until
from tests.live import gunicorn_running
from tests.patroni_cluster import PatroniCluster, WriteProbe, patroni_cluster
from tests.test_failover import FINAL, Outcome, _app, _test_database_url, clients_start, ledger_reconcile

pytestmark = pytest.mark.proof

PATRONI_RESTART_SECONDS = 5  # a service manager's restart delay (systemd's RestartSec)
REPLICA_AWAY_SECONDS = 8


def _leader_is_not(cluster: PatroniCluster, name: str) -> Callable[[], bool]:
    def moved() -> bool:
        leader = cluster.leader()
        return leader is not None and leader.name != name

    return moved


def fault_postmaster_kill(cluster: PatroniCluster) -> None:
    cluster.synchronous_wait()  # with no synchronous replica to promote, Patroni restarts the crashed primary in place
    old = cluster.leader_wait()
    old.postmaster_kill()
    until(_leader_is_not(cluster, old.name), "Patroni to promote the replica", seconds=90, poll=0.2, why=cluster.logs)


def fault_leader_machine_lost(cluster: PatroniCluster) -> None:
    """No agent left to give up the key: the replica takes it once its lease (ttl) expires."""
    cluster.synchronous_wait()
    old = cluster.leader_wait()
    old.machine_kill()
    until(_leader_is_not(cluster, old.name), "the replica to take the expired leader key", seconds=90, poll=0.2, why=cluster.logs)
    old.start()  # the machine back: Patroni rewinds the old leader onto the new one


def fault_patroni_kill(cluster: PatroniCluster) -> None:
    leader = cluster.leader_wait()
    leader.patroni_kill()
    time.sleep(PATRONI_RESTART_SECONDS)
    leader.start()
    cluster.leader_wait()


def fault_switchover(cluster: PatroniCluster) -> None:
    old = cluster.leader_wait()
    done = cluster.switchover(candidate=cluster.synchronous_wait())
    assert done.returncode == 0, done.stdout + done.stderr
    until(_leader_is_not(cluster, old.name), "the switchover's new leader", seconds=60, poll=0.2, why=cluster.logs)


def fault_replica_loss(cluster: PatroniCluster) -> None:
    replica = cluster.synchronous_wait()
    replica.machine_kill()
    time.sleep(REPLICA_AWAY_SECONDS)
    replica.start()


def _scenario(name: str, fault: Callable[[PatroniCluster], None], tmp_path: Path, *, clients: int, before: float, after: float) -> None:
    started = time.monotonic()
    with patroni_cluster(dump_from=_test_database_url()) as cluster:
        redis_port, web_port = cluster.spare_ports[:2]
        redis_server = OwnRedis(tmp_path, redis_port)
        redis_server.start()
        env = dict(os.environ)
        env.pop("PYTEST_XDIST_WORKER", None)
        env.update(DJANGO_SETTINGS_MODULE="config.settings.local", DATABASE_URL=cluster.database_url(), REDIS_URL=redis_server.url,
                   CELERY_BROKER_URL=redis_server.url, DJANGO_DEBUG="false", TALLY_LOG_LEVEL="INFO",
                   CELERY_TASK_SOFT_TIME_LIMIT="3", CELERY_TASK_TIME_LIMIT="20")
        try:
            seeded = _app(env, "seed", str(tmp_path / "keys.json"), "100")
            seeded_file = tmp_path / "seeded.json"
            seeded_file.write_text(json.dumps(seeded))
            terminal_key, customers = seeded["keys"]["terminal"], seeded["customers"]
            worker = celery_worker(env, tmp_path / "worker.log")
            beat = celery_beat(env, tmp_path / "beat.log")
            web_env = {k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
            web_env["TALLY_LOG_LEVEL"] = "WARNING"
            try:
                with gunicorn_running(workers=2, log=tmp_path / "gunicorn.log", port=web_port,
                                      TALLY_OUTBOX_RELAY_KICK="true", **web_env) as port:
                    outcomes: list[Outcome] = []
                    deadline = time.monotonic() + before + after + 180  # a key in flight is retried until this
                    with WriteProbe(cluster) as probe:
                        stop_new, threads = clients_start(port, terminal_key, customers, clients=clients, prefix=name, deadline=deadline,
                                                          outcomes=outcomes)
                        time.sleep(before)
                        fault_at = time.monotonic()
                        fault(cluster)
                        cluster.synchronous_wait()  # the cluster whole again before the load ends
                        time.sleep(after)
                        stop_new.set()
                        for thread in threads:
                            thread.join(timeout=200)
                    without_primary = probe.longest_gap(after=fault_at)
                    sweeps_sent = beat.log.read_text().count("Sending due task webhooks-relay")
                for proc in (worker, beat):
                    assert proc.alive(), proc.output()
                # Beat reads its schedule from the database: it carries on against the leader.
                until(lambda: beat.log.read_text().count("Sending due task webhooks-relay") > sweeps_sent, "beat's next sweep",
                      seconds=30, why=beat.output)
                checked = _app(env, "check", str(seeded_file))
                until(lambda: _app(env, "check", str(seeded_file))["events_unpublished"] == 0, "every outbox event to be relayed",
                      seconds=120, poll=2, why=lambda: worker.output() + beat.output())
            finally:
                worker.stop()
                beat.stop()
            reconcile = ledger_reconcile(env)
            leader = cluster.leader_wait().name
        finally:
            redis_server.stop()
    seconds = time.monotonic() - started

    finals = {o.key: o.answers[-1] for o in outcomes if o.answers and o.answers[-1][1] in FINAL}
    unanswered = [o.key for o in outcomes if o.key not in finals]
    assert not unanswered, f"{len(unanswered)} key(s) never got a final answer"
    server_errors = [a for o in outcomes for a in o.answers if a[1] == 500]
    assert not server_errors, server_errors[:5]
    acknowledged = {a[2] for o in outcomes for a in o.answers if a[1] == 201}
    stored = set(checked["payments"])
    assert acknowledged <= stored, acknowledged - stored  # nothing acknowledged was lost
    doubled = 0
    for outcome in outcomes:  # every answer a key got names the same payment: one effect
        paid = {a[2] for a in outcome.answers if a[1] == 201}
        doubled += len(paid) > 1
    assert not doubled
    answered = {a[2] for a in finals.values() if a[1] == 201}
    assert stored == answered, (sorted(stored - answered)[:5], sorted(answered - stored)[:5])  # no payment without its key's answer
    assert reconcile.returncode == 0, reconcile.stdout[-3000:] + reconcile.stderr[-3000:]
    retried = sum(1 for o in outcomes if o.errors or len(o.answers) > 1)
    figures(f"patroni-{name}", requests=sum(len(o.answers) + o.errors for o in outcomes), keys=len(outcomes), faults=1,
            seconds_without_writable_primary=round(without_primary, 1), retried=retried, lost=len(acknowledged - stored),
            doubled=doubled, leader=leader, seconds=round(seconds, 1))


def test_the_leaders_postmaster_killed_patroni_promotes_the_replica(django_db_setup: None, tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    long = request.config.getoption("--long")
    clients, before, after = (6, 8.0, 12.0) if long else (3, 4.0, 5.0)
    _scenario("postmaster-kill", fault_postmaster_kill, tmp_path, clients=clients, before=before, after=after)


@pytest.mark.long_only
def test_the_leaders_patroni_killed_and_restarted_keeps_the_primary(django_db_setup: None, tmp_path: Path) -> None:
    _scenario("patroni-kill", fault_patroni_kill, tmp_path, clients=6, before=8.0, after=12.0)


@pytest.mark.long_only
def test_the_leaders_machine_lost_the_replica_takes_the_expired_key(django_db_setup: None, tmp_path: Path) -> None:
    _scenario("leader-machine-lost", fault_leader_machine_lost, tmp_path, clients=6, before=8.0, after=12.0)


@pytest.mark.long_only
def test_a_planned_switchover(django_db_setup: None, tmp_path: Path) -> None:
    _scenario("switchover", fault_switchover, tmp_path, clients=6, before=8.0, after=12.0)


@pytest.mark.long_only
def test_the_replica_lost_and_brought_back(django_db_setup: None, tmp_path: Path) -> None:
    _scenario("replica-loss", fault_replica_loss, tmp_path, clients=6, before=8.0, after=12.0)


def _served_by(url: str) -> int | None:
    """The PostgreSQL port behind `url` when it takes writes, else None."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row is not None and not row[1] else None


@pytest.mark.long_only
def test_haproxy_checking_patronis_rest_api_follows_the_leader() -> None:
    """devtools/ops/haproxy.cfg in front of the cluster: its one address reaches the leader,
    and the new leader after a switchover and after the leader's postmaster is killed."""
    with patroni_cluster() as cluster, cluster.haproxy() as url:
        for fault in (None, fault_switchover, fault_postmaster_kill):
            if fault is not None:
                fault(cluster)
            leader = cluster.leader_wait()
            until(lambda leader_port=leader.pg_port: _served_by(url) == leader_port, f"HAProxy to reach {leader.name}",
                  seconds=30, poll=0.3, why=cluster.logs)
