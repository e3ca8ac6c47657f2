"""A real Celery worker process (config/celery.py): it keeps its database connection
across tasks instead of opening one per task, and when the server kills that connection
the next task still runs, on a new one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from django.db import connection

from payments.models import OutboxEvent
from payments.relaykick import RELAY_TASK_NAME
from payments.services.outbox import outbox_event_create
from tenants.models import Tenant
from tests.factories import MerchantFactory
from tests.pooler import behind_a_pooler
from tests.receivers import process_stop
from wallets.transactions import run_atomic

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def worker(live_tenant: Tenant, settings: Any, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    settings.TALLY_OUTBOX_RELAY_KICK = False  # only the tasks this test sends relay
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test", TALLY_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        DATABASE_CONN_MAX_AGE="600",
    )
    # The worker's output goes to a file: a pipe that nobody reads fills up with its log
    # (a failed task's traceback is kilobytes), and the worker then blocks writing to it.
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "solo", "--loglevel", "WARNING", "--without-heartbeat",
             "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    _WORKER_LOGS[process.pid] = log_path
    try:
        yield process
    finally:
        process_stop(process, timeout=20, group=True)


_WORKER_LOGS: dict[int, Path] = {}


def _worker_log(process: subprocess.Popen[bytes]) -> str:
    return _WORKER_LOGS[process.pid].read_text(errors="replace")[-3000:]


def _until(condition: Callable[[], Any], process: subprocess.Popen[bytes], what: str, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"the worker exited: {_worker_log(process)}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {_worker_log(process)}")


def _worker_backends() -> list[tuple[int, Any]]:
    """(pid, backend_start) of the sessions on this test database other than ours."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' ORDER BY pid"
        )
        return [(int(pid), started) for pid, started in cursor.fetchall()]


def _relayed_by_the_worker(live_tenant: Tenant, merchant_id: str, n: int, process: subprocess.Popen[bytes]) -> None:
    event = run_atomic(
        lambda: outbox_event_create(topic="payment.succeeded", payload={"id": f"pay_w{n}", "object": "payment", "merchant": merchant_id}),
        operation="test_event",
    )
    current_app.send_task(RELAY_TASK_NAME, headers={"_schema_name": live_tenant.schema_name}, retry=False, ignore_result=True)
    _until(lambda: OutboxEvent.objects.filter(pk=event.pk, published_at__isnull=False).exists(), process, f"the worker to relay event {n}")


@pytest.mark.proof
@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")  # send_task goes to the real worker
def test_a_worker_keeps_its_connection_across_tasks_and_replaces_one_the_server_killed(
    live_tenant: Tenant, worker: subprocess.Popen[bytes]
) -> None:
    if behind_a_pooler():
        pytest.skip("watches the worker's server sessions close: behind a pooler they stay in its pool")
    merchant_id = MerchantFactory().pk
    _relayed_by_the_worker(live_tenant, merchant_id, 1, worker)
    first = _until(_worker_backends, worker, "the worker's session")
    for n in range(2, 5):
        _relayed_by_the_worker(live_tenant, merchant_id, n, worker)
    assert _worker_backends() == first  # the same session served every task (was: one per task)

    # A task that fails closes its connections: session state it may have left (a webhook
    # endpoint's advisory lock) ends with them. This one names no tenant that exists.
    current_app.send_task(RELAY_TASK_NAME, headers={"_schema_name": "no_such_schema"}, retry=False, ignore_result=True)
    _until(lambda: not _worker_backends(), worker, "the failed task's session to close")
    _relayed_by_the_worker(live_tenant, merchant_id, 5, worker)
    second = _worker_backends()
    assert second and second[0][0] != first[0][0]

    with connection.cursor() as cursor:  # the server ends the worker's session
        cursor.execute("SELECT pg_terminate_backend(%s)", [second[0][0]])
    _until(lambda: not _worker_backends(), worker, "the session to end")
    _relayed_by_the_worker(live_tenant, merchant_id, 6, worker)  # the next task runs on a new one
    replaced = _worker_backends()
    assert replaced and replaced[0][0] != second[0][0]


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_a_commits_kick_reaches_the_worker_whose_relay_clears_its_mark(
    live_tenant: Tenant, worker: subprocess.Popen[bytes], settings: Any, monkeypatch: Any
) -> None:
    """The kick as `make run` sends it: after the commit, with its token as the task's
    argument, which the worker's relay needs to clear the pending mark (a relay without it
    leaves the mark to lapse, and kicks stop until it does)."""
    import payments.relaykick as outbox
    from fastpath.fastredis import fast_redis
    from payments.relaykick import _kick_pending_key
    from tests.test_outbox_kick import mark_reset, not_eager

    settings.TALLY_OUTBOX_RELAY_KICK = True
    monkeypatch.setattr(outbox, "KICK_PENDING_SECONDS", 600)  # no lapse during the test
    mark_reset(live_tenant.schema_name)
    merchant_id = MerchantFactory().pk
    with not_eager():
        event = run_atomic(
            lambda: outbox_event_create(topic="payment.succeeded", payload={"id": "pay_k", "object": "payment", "merchant": merchant_id}),
            operation="test_event",
        )
    assert fast_redis().get(_kick_pending_key(live_tenant.schema_name)) is not None  # kicked
    _until(lambda: OutboxEvent.objects.filter(pk=event.pk, published_at__isnull=False).exists(), worker, "the kicked relay")
    _until(lambda: fast_redis().get(_kick_pending_key(live_tenant.schema_name)) is None, worker, "the kicked relay to clear its mark", seconds=5)


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")  # the tasks go to the real worker
def test_a_worker_consumes_every_queue_and_settles_the_due_work_beat_sent_it(
    live_tenant: Tenant, worker: subprocess.Popen[bytes], settings: Any
) -> None:
    """A worker started as the tests and the fault suite start it (no -Q) consumes every
    queue in settings.CELERY_TASK_QUEUES, as the Procfile's (-Q with all of them) does. A
    relay sent the way beat sends it (queue "webhooks") publishes the event and settles the
    tenant's due-work rows (a stale "later" row is rewritten or deleted)."""
    from datetime import UTC, datetime

    from tenants.models import DueWork

    replies = _until(lambda: current_app.control.inspect(timeout=2).active_queues(), worker, "the worker's queues")
    (queues,) = replies.values()
    assert {q["name"] for q in queues} == set(settings.CELERY_TASK_QUEUES)

    merchant_id = MerchantFactory().pk
    event = run_atomic(
        lambda: outbox_event_create(topic="payment.succeeded", payload={"id": "pay_wq", "object": "payment", "merchant": merchant_id}),
        operation="test_event",
    )
    assert DueWork.objects.filter(tenant_id=live_tenant.schema_name, kind="relay").exists()
    stale = datetime(2100, 1, 1, tzinfo=UTC)
    DueWork.objects.update_or_create(tenant_id=live_tenant.schema_name, kind="relay_later", defaults={"due_at": stale})
    current_app.send_task("webhooks.relay_scheduled", headers={"_schema_name": live_tenant.schema_name}, retry=False, ignore_result=True)
    _until(lambda: OutboxEvent.objects.filter(pk=event.pk, published_at__isnull=False).exists(), worker, "the scheduled relay")
    _until(lambda: not DueWork.objects.filter(tenant_id=live_tenant.schema_name, due_at=stale).exists(), worker, "the due-work rows settled")


@pytest.mark.parametrize("program", [["worker", "--pool", "solo", "--without-heartbeat", "--without-mingle", "--without-gossip"], ["beat"]])
def test_a_worker_or_beat_without_a_usable_sealing_ring_refuses_to_start(
    program: list[str], tmp_path: Path, django_db_setup: None, django_db_blocker: Any
) -> None:
    """Celery runs no system checks: the worker and beat check the ring themselves and exit
    saying what is wrong and how to fix it, before they take a task or send one."""
    with django_db_blocker.unblock():
        database = str(connection.settings_dict["NAME"])  # beat reads its schedule before it starts
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.test", TALLY_SEALING_KEYS="k1:not-a-key", TALLY_TEST_DB_NAME=database)
    schedule = ["--schedule", str(tmp_path / "beat")] if program == ["beat"] else []
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "config", *program, "--loglevel", "WARNING", *schedule],
        cwd=ROOT, env=env, capture_output=True, timeout=120,
    )
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode != 0, output
    assert "refusing to start" in output and "is not base64" in output and "os.urandom(32)" in output, output[-3000:]


def test_the_legacy_key_still_set_is_logged_when_a_process_starts(settings: Any, caplog: Any) -> None:
    from config.celery import _sealing_ring_refuse
    from wallets.sealing import sealing_ring_forget

    settings.TALLY_SEALING_LEGACY_SECRET_KEY = "the-old-secret-key"
    sealing_ring_forget()
    with caplog.at_level("WARNING", logger="tally.sealing"):
        _sealing_ring_refuse()
    assert any("tally.W001" in r.getMessage() and "secrets_reseal" in r.getMessage() for r in caplog.records)
    assert "the-old-secret-key" not in caplog.text
