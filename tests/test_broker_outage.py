"""The Celery worker and beat through a Redis outage: Redis (the test's own, on a port of
its own) is killed and started again while events are written and relay tasks are in
flight. Both processes ride it out and resume by themselves, and every event is relayed:
a kick lost with the broker is covered by beat's sweep. The same for PostgreSQL sessions
the server ends under the worker."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from django.db import connection

from payments.models import OutboxEvent
from payments.relaykick import RELAY_TASK_NAME
from payments.services.outbox import outbox_event_create
from tenants.models import Tenant
from tests.conftest import run_in_thread_tenant
from tests.factories import MerchantFactory
from tests.faults import OwnRedis, Proc, celery_beat, celery_worker, figures, own_redis, process_env, until
from wallets.transactions import run_atomic

pytestmark = [pytest.mark.proof, pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[OwnRedis]:
    with own_redis(tmp_path) as server:
        yield server


@pytest.fixture
def stack(live_tenant: Tenant, settings: Any, redis_server: OwnRedis, tmp_path: Path) -> Iterator[tuple[Proc, Proc]]:
    settings.TALLY_OUTBOX_RELAY_KICK = False  # this test sends the kicks itself, to its own Redis
    # The relay holds each claimed batch a moment, so that tasks are in flight (delivered,
    # not yet acknowledged) when the broker goes.
    env = process_env(REDIS_URL=redis_server.url, CELERY_BROKER_URL=redis_server.url, TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS="0.3")
    worker = celery_worker(env, tmp_path / "worker.log")
    beat = celery_beat(env, tmp_path / "beat.log")
    try:
        until(lambda: "ready." in worker.output(), "the worker to start", why=worker.output)
        yield worker, beat
    finally:
        worker.stop()
        beat.stop()


class _Load:
    """Events written in committed transactions, each followed by a relay kick sent to the
    test's Redis as a payment's commit sends one: most with a short countdown, which the
    worker holds delivered and unacknowledged (the messages whose restore killed the worker
    when the broker went). A kick the broker refuses is counted and left to the sweep."""

    def __init__(self, tenant: Tenant, broker_url: str) -> None:
        self.tenant, self.broker_url = tenant, broker_url
        self.merchant_id = MerchantFactory().pk
        self.event_ids: list[int] = []
        self.kicks_lost = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=run_in_thread_tenant, args=(tenant, self._run), daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            event = run_atomic(
                lambda n=n: outbox_event_create(
                    topic="payment.succeeded", payload={"id": f"pay_o{n}", "object": "payment", "merchant": self.merchant_id}
                ),
                operation="test_event",
            )
            self.event_ids.append(event.pk)
            try:
                with current_app.connection_for_write(self.broker_url) as broker:
                    current_app.send_task(RELAY_TASK_NAME, headers={"_schema_name": self.tenant.schema_name}, retry=False,
                                          ignore_result=True, connection=broker, countdown=1.0 if n % 4 else None)
            except Exception:  # the broker is down: the sweep relays it
                self.kicks_lost += 1
            time.sleep(0.05)


def test_the_worker_and_beat_ride_out_redis_outages_and_relay_every_event(
    live_tenant: Tenant, redis_server: OwnRedis, stack: tuple[Proc, Proc], request: pytest.FixtureRequest
) -> None:
    worker, beat = stack
    long = request.config.getoption("--long")
    outages = [random.uniform(1, 30) for _ in range(10)] if long else [1.0, 3.0, 2.0]
    load = _Load(live_tenant, redis_server.url)
    load.thread.start()
    try:
        for seconds in outages:
            time.sleep(2.0)
            redis_server.stop()
            time.sleep(seconds)
            redis_server.start()
            assert worker.alive(), worker.output()
            assert beat.alive(), beat.output()
        time.sleep(2.0)
    finally:
        load.stopping.set()
        load.thread.join(timeout=30)
    assert worker.alive() and beat.alive()
    written = list(load.event_ids)
    # Every event relayed, with no help: the worker reconnected and beat's sweep, sent
    # again once Redis was back, caught what the lost kicks missed.
    until(
        lambda: OutboxEvent.objects.filter(pk__in=written, published_at__isnull=True).count() == 0,
        "every event to be relayed", seconds=90, poll=0.5, why=lambda: worker.output() + beat.output(),
    )
    for proc in (worker, beat):
        assert proc.alive(), proc.output()
        assert "Unrecoverable error" not in proc.log.read_text(errors="replace"), proc.output()
    figures("redis-outage", events=len(written), faults=len(outages), outage_seconds=round(sum(outages), 1),
            kicks_lost=load.kicks_lost, lost=0)


def _sessions_of(*application_names: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = ANY(%s)", [list(application_names)]
        )
        return [int(pid) for (pid,) in cursor.fetchall()]


def test_the_worker_and_beat_ride_out_their_postgresql_sessions_ended_by_the_server(
    live_tenant: Tenant, redis_server: OwnRedis, stack: tuple[Proc, Proc]
) -> None:
    worker, beat = stack
    load = _Load(live_tenant, redis_server.url)
    load.thread.start()
    terminated = 0
    try:
        for _ in range(3):
            time.sleep(2.0)
            with connection.cursor() as cursor:
                for pid in _sessions_of("fault-worker", "fault-beat"):
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                    terminated += 1
        time.sleep(2.0)
    finally:
        load.stopping.set()
        load.thread.join(timeout=30)
    written = list(load.event_ids)
    until(
        lambda: OutboxEvent.objects.filter(pk__in=written, published_at__isnull=True).count() == 0,
        "every event to be relayed", seconds=90, poll=0.5, why=lambda: worker.output() + beat.output(),
    )
    assert terminated > 0
    for proc in (worker, beat):
        assert proc.alive(), proc.output()
    figures("postgres-sessions-ended", events=len(written), faults=terminated, kicks_lost=load.kicks_lost, lost=0)
