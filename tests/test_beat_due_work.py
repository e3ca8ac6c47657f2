"""Beat finds the tenants with due work in one public table (tenants.duework) instead of
visiting every tenant every 10 s. The commit that makes work due marks its tenant in the
same transaction without queueing behind the tenant's other commits; a worker settles the
row only once it has seen that nothing is due, and a commit in flight is never lost to
that settle (real threads, real transactions, real PostgreSQL). Each kind of task lands
on its own Celery queue (real Redis)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone

from idempotency.tasks import idempotency_purge_tenant
from payments.models import OutboxEvent
from payments.relaykick import RELAY_TASK_NAME
from payments.services.outbox import outbox_event_create
from payments.tasks import topups_recover_due_tenants, topups_recover_tenant
from reconciliation.tasks import reconciliation_run_tenant
from tenants.duework import due_work_mark, due_work_schemas, due_work_settle
from tenants.models import DueWork, DueWorkKind, Tenant
from tests.conftest import in_background
from tests.factories import MerchantFactory
from wallets.transactions import run_atomic
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpointStatus
from webhooks.services.endpoints import webhook_endpoint_create, webhook_endpoint_update
from webhooks.services.relay import relay_due_settle
from webhooks.tasks import webhooks_outbox_relay, webhooks_relay_due_tenants, webhooks_relay_scheduled

RELAY_KINDS = [DueWorkKind.RELAY, DueWorkKind.RELAY_LATER]
RACE_TOPIC = "duework.race"


def due_rows(schema_name: str) -> dict[str, datetime]:
    return {str(kind): due for kind, due in DueWork.objects.filter(tenant_id=schema_name).values_list("kind", "due_at")}


def relay_quiet() -> None:
    """Nothing of the relay's due in this tenant (inside the test's rolled-back transaction)."""
    now = timezone.now()
    OutboxEvent.objects.filter(published_at__isnull=True).update(published_at=now, dead_at=None)
    WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.PENDING).update(status=WebhookDeliveryStatus.FAILED)


# --- Marking, in the transaction that makes the work due ---------------------------------------


def test_an_event_marks_its_tenant_due_in_its_own_transaction(tenant: Tenant) -> None:
    schema = tenant.schema_name
    DueWork.objects.filter(tenant_id=schema).delete()
    payload = {"id": "pay_due1", "object": "payment", "merchant": "mer_x"}

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        outbox_event_create(topic="payment.succeeded", payload=payload)
        assert set(due_rows(schema)) == {"relay"}  # seen inside the transaction
        raise Undo
    assert due_rows(schema) == {}  # rolled back with the event

    before = timezone.now()
    with transaction.atomic():
        outbox_event_create(topic="payment.succeeded", payload=payload)
        outbox_event_create(topic="payment.refunded", payload=payload)
    rows = due_rows(schema)
    assert set(rows) == {"relay"} and before <= rows["relay"] <= timezone.now()


def test_re_enabling_an_endpoint_marks_its_pending_deliveries_due(tenant: Tenant) -> None:
    endpoint, _ = webhook_endpoint_create(merchant=MerchantFactory(), url="https://93.184.215.14/h", enabled_events=["*"])
    webhook_endpoint_update(endpoint=endpoint, status=WebhookEndpointStatus.DISABLED)
    DueWork.objects.filter(tenant_id=tenant.schema_name).delete()
    webhook_endpoint_update(endpoint=endpoint, status=WebhookEndpointStatus.ENABLED)
    assert set(due_rows(tenant.schema_name)) == {"relay"}


@pytest.fixture
def race_events(live_tenant: Tenant, settings: Any) -> Iterator[Callable[[], datetime | None]]:
    """This test's events only (committed rows): when the next of them is due. No kicks:
    the eager relay they run here would publish the events at each commit."""
    settings.TALLY_OUTBOX_RELAY_KICK = False

    def publish_all() -> None:
        OutboxEvent.objects.filter(topic=RACE_TOPIC, published_at__isnull=True).update(published_at=timezone.now())

    def next_due() -> datetime | None:
        due: datetime | None = OutboxEvent.objects.filter(topic=RACE_TOPIC, published_at__isnull=True).aggregate(m=Min("created"))["m"]
        return due

    publish_all()
    DueWork.objects.filter(tenant_id=live_tenant.schema_name).delete()
    yield next_due
    connection.set_tenant(live_tenant)
    publish_all()
    DueWork.objects.filter(tenant_id=live_tenant.schema_name).delete()


def _race_event() -> OutboxEvent:
    return outbox_event_create(topic=RACE_TOPIC, payload={"id": "", "object": "test"})




def _mark_while_a_commit_is_open(
    tenant: Tenant, first: Callable[[], None], *, marked: threading.Event, release: threading.Event
) -> None:
    """Commit an event that marks while `first` (on its own connection) holds a commit open
    after it marked; the mark must not wait for it (lock_timeout 1 s)."""
    thread, box = in_background(tenant, first)
    try:
        assert marked.wait(10), box
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '1s'")
            _race_event()
    finally:
        release.set()
        thread.join(10)
    assert "error" not in box, box


def test_commits_of_one_tenant_mark_without_waiting_for_each_other_or_writing(live_tenant: Tenant, race_events: Any) -> None:
    """The row exists: a second commit's mark neither waits for the first commit (still
    open) nor writes the row. A row lock (ON CONFLICT DO UPDATE, SELECT FOR UPDATE) would
    make it wait, and run into its lock_timeout."""
    schema = live_tenant.schema_name
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM tenants_duework WHERE tenant_id = %s AND kind = 'relay'", [schema])
        version = cursor.fetchone()
    marked, release = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            _race_event()
            with connection.cursor() as cursor:  # the shared lock is held by this open transaction
                cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' AND pid = pg_backend_pid()")
                assert cursor.fetchone() == (1,)
            marked.set()
            assert release.wait(10)

    _mark_while_a_commit_is_open(live_tenant, first, marked=marked, release=release)
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM tenants_duework WHERE tenant_id = %s AND kind = 'relay'", [schema])
        assert cursor.fetchone() == version  # the same row version: nothing was written


def test_commits_that_find_no_row_do_not_wait_for_each_others_insert(live_tenant: Tenant, race_events: Any) -> None:
    """Right after a settle deleted the row, two commits mark. With a unique key on (tenant,
    kind) the second insert would wait for the first's commit, queueing the tenant's
    payments and, for a payment that marked before locking its balance rows, risking a
    deadlock. Each inserts its own row instead; the settle removes them all."""
    schema = live_tenant.schema_name
    DueWork.objects.filter(tenant_id=schema).delete()
    marked, release = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            _race_event()  # marks: inserts a row this open transaction holds
            marked.set()
            assert release.wait(10)

    _mark_while_a_commit_is_open(live_tenant, first, marked=marked, release=release)
    assert DueWork.objects.filter(tenant_id=schema, kind=DueWorkKind.RELAY).count() == 2
    assert schema in due_work_schemas(kinds=RELAY_KINDS)
    OutboxEvent.objects.filter(topic=RACE_TOPIC).update(published_at=timezone.now())
    assert due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=race_events) is True
    assert not DueWork.objects.filter(tenant_id=schema, kind=DueWorkKind.RELAY).exists()


def test_a_settle_whose_reads_overrun_gives_up_and_leaves_the_rows(live_tenant: Tenant) -> None:
    """While a settle holds the exclusive lock, the tenant's marking writers wait: its reads
    have a budget, and one that overruns it changes nothing."""
    schema = live_tenant.schema_name
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    before = due_rows(schema)

    def slow_next_due() -> datetime | None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
        return None

    assert due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=slow_next_due) is False
    assert due_rows(schema) == before
    with connection.cursor() as cursor:  # the budget ended with the settle
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"


def test_a_session_lock_with_the_same_hash_does_not_hold_up_a_mark(live_tenant: Tenant) -> None:
    """Due-work locks live in their own key space: a session advisory lock elsewhere (a
    recovery pass holds one for its whole run) on the same 32-bit hash never makes a
    tenant's writers wait."""
    import psycopg

    from tenants.duework import _lock_name

    name = _lock_name(schema_name=live_tenant.schema_name, kind=DueWorkKind.RELAY)
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", [name])  # the one-key space, same hash
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '500ms'")
            due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())  # waited, it would fail here


def test_a_settle_while_a_commit_is_in_flight_keeps_the_row(live_tenant: Tenant, race_events: Callable[[], datetime | None]) -> None:
    """A commit found the row and wrote nothing; a settle then sees no work (the commit's
    event is not visible yet). It must not delete the row: it cannot take the lock."""
    schema = live_tenant.schema_name
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    marked, release = threading.Event(), threading.Event()

    def writer() -> None:
        with transaction.atomic():
            _race_event()
            marked.set()
            assert release.wait(10)

    thread, box = in_background(live_tenant, writer)
    try:
        assert marked.wait(10), box
        assert race_events() is None  # the settle cannot see the event...
        assert due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=race_events) is False
        assert set(due_rows(schema)) == {"relay"}  # ...and left the row
    finally:
        release.set()
        thread.join(10)
    assert "error" not in box, box
    assert race_events() is not None
    assert due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=race_events) is True
    assert set(due_rows(schema)) == {"relay"}  # the event is due: the row stays
    OutboxEvent.objects.filter(topic=RACE_TOPIC).update(published_at=timezone.now())
    assert due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=race_events) is True
    assert due_rows(schema) == {}  # nothing left: the row goes


def test_a_commit_that_marks_while_a_settle_deletes_the_row_writes_it_again(
    live_tenant: Tenant, race_events: Callable[[], datetime | None]
) -> None:
    """The settle holds the lock and has read "nothing due"; a commit marks meanwhile. The
    commit's mark waits for the settle, then finds the row gone and writes it: its event,
    committed after the settle's read, keeps a row. (A mark that checked for the row before
    it held the lock would see it, write nothing, and strand the event.)"""
    schema = live_tenant.schema_name
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    read, proceed, writer_marked = threading.Event(), threading.Event(), threading.Event()

    def next_due_then_pause() -> datetime | None:
        due = race_events()
        read.set()
        assert proceed.wait(10)
        return due

    def settle() -> bool:
        return due_work_settle(kind=DueWorkKind.RELAY, later_kind=DueWorkKind.RELAY_LATER, next_due=next_due_then_pause)

    def writer() -> None:
        with transaction.atomic():
            _race_event()
            writer_marked.set()

    settling, settled = in_background(live_tenant, settle)
    writing: threading.Thread | None = None
    try:
        assert read.wait(10), settled
        writing, written = in_background(live_tenant, writer)
        assert not writer_marked.wait(0.5)  # the mark waits for the settle's transaction
    finally:
        proceed.set()
        settling.join(10)
        if writing is not None:
            writing.join(10)
    assert settled == {"result": True} and "error" not in written, (settled, written)
    assert race_events() is not None
    assert set(due_rows(schema)) == {"relay"}


# --- Settling: what is due next --------------------------------------------------------------


def test_a_settle_moves_the_row_to_the_next_retry_and_drops_it_when_nothing_is_left(tenant: Tenant) -> None:
    schema = tenant.schema_name
    relay_quiet()
    DueWork.objects.filter(tenant_id=schema).delete()
    endpoint, _ = webhook_endpoint_create(merchant=MerchantFactory(), url="https://93.184.215.14/h", enabled_events=["*"])
    event = outbox_event_create(topic="payment.succeeded", payload={"id": "pay_due2", "object": "payment", "merchant": endpoint.merchant_id})
    assert set(due_rows(schema)) == {"relay"}
    assert relay_due_settle() and set(due_rows(schema)) == {"relay"}  # the event is still to publish

    now = timezone.now()
    retry_at = now + timedelta(hours=1)
    OutboxEvent.objects.filter(pk=event.pk).update(published_at=now)
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event=event, topic=event.topic, event_created=event.created, next_attempt_at=retry_at,
        give_up_at=now + timedelta(days=3), created=now,
    )
    assert relay_due_settle()
    assert due_rows(schema) == {"relay_later": retry_at}  # the retry, not now
    assert schema not in due_work_schemas(kinds=RELAY_KINDS, now=now)
    assert schema in due_work_schemas(kinds=RELAY_KINDS, now=retry_at)

    # A new event is due now, whatever the later row says; beat sees the tenant at once.
    # (The mark its commit makes: this test is one transaction, which marked once already.)
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    assert set(due_rows(schema)) == {"relay", "relay_later"}
    assert schema in due_work_schemas(kinds=RELAY_KINDS, now=timezone.now())
    relay_quiet()

    # Being sent (leased): due now, so the tenant is visited until its outcome is recorded.
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=WebhookDeliveryStatus.PENDING, leased_until=now + timedelta(minutes=1), next_attempt_at=now + timedelta(minutes=1)
    )
    assert relay_due_settle() and set(due_rows(schema)) == {"relay"}

    # A disabled endpoint's deliveries are nobody's work until it is enabled again.
    WebhookDelivery.objects.filter(pk=delivery.pk).update(leased_until=None, next_attempt_at=now)
    webhook_endpoint_update(endpoint=endpoint, status=WebhookEndpointStatus.DISABLED)
    assert relay_due_settle() and due_rows(schema) == {}


def test_the_relay_beat_sends_settle_and_kicked_ones_do_not(tenant: Tenant, monkeypatch: Any) -> None:
    schema = tenant.schema_name
    relay_quiet()
    DueWork.objects.filter(tenant_id=schema).delete()
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    webhooks_outbox_relay.apply(kwargs={"kick_token": "k"})
    assert set(due_rows(schema)) == {"relay"}
    webhooks_relay_scheduled.apply()
    assert due_rows(schema) == {}


def test_a_tenant_that_is_not_active_is_not_sent_work(tenant: Tenant, tenant_b: Tenant) -> None:
    DueWork.objects.all().delete()
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    Tenant.objects.filter(pk=tenant_b.pk).update(is_active=False)
    DueWork.objects.create(tenant_id=tenant_b.schema_name, kind=DueWorkKind.RELAY, due_at=timezone.now())
    assert due_work_schemas(kinds=RELAY_KINDS) == [tenant.schema_name]


# --- Queues (real Redis) ---------------------------------------------------------------------


QUEUES = ("celery", "relay", "webhooks", "recovery", "reconciliation")


@pytest.fixture
def broker(tenant: Tenant) -> Iterator[redis.Redis]:
    """The broker's Redis, its queues empty, and tasks sent to it rather than run here;
    emptied again after (a later test's worker must not find these messages)."""
    client = redis.Redis.from_url(current_app.conf.broker_url)
    client.delete(*QUEUES)
    saved = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = False
    try:
        yield client
    finally:
        current_app.conf.task_always_eager = saved
        client.delete(*QUEUES)
        client.close()


def queued(client: redis.Redis) -> dict[str, list[tuple[str, str]]]:
    """(task name, tenant schema) of each message waiting on each queue (kombu's Redis lists)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for queue in QUEUES:
        for raw in client.lrange(queue, 0, -1):
            headers = json.loads(raw)["headers"]
            found.setdefault(queue, []).append((headers["task"], headers.get("_schema_name", "")))
    return found


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_each_kind_of_task_lands_on_its_own_queue(broker: redis.Redis, tenant: Tenant) -> None:
    schema = tenant.schema_name
    current_app.send_task(RELAY_TASK_NAME, headers={"_schema_name": schema}, retry=False, ignore_result=True)  # a commit's kick
    webhooks_outbox_relay.delay()
    webhooks_relay_scheduled.delay()
    topups_recover_tenant.delay()
    reconciliation_run_tenant.delay(run_id=1)
    idempotency_purge_tenant.delay()
    assert queued(broker) == {
        "relay": [(RELAY_TASK_NAME, schema), (RELAY_TASK_NAME, schema)],
        "webhooks": [("webhooks.relay_scheduled", schema)],
        "recovery": [("payments.topups_recover_tenant", schema)],
        "reconciliation": [("reconciliation.run_tenant", schema)],
        "celery": [("idempotency.purge_tenant", schema)],
    }


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_a_switched_off_tenant_still_gets_top_up_recovery_and_the_settlement_check(
    broker: redis.Redis, tenant: Tenant, tenant_b: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    """Card money is settled or given back whatever became of the operator: beat still sends
    a switched-off tenant its top-up recovery (the due task and the sweep) and a
    reconciliation run of the PSP settlement check alone; its webhook relay stays paused.
    The fan-outs used to select active tenants for all of them."""
    from payments.tasks import topups_recover_all_tenants
    from reconciliation.tasks import reconciliation_run_all_tenants

    DueWork.objects.all().delete()
    Tenant.objects.filter(pk=tenant_b.pk).update(is_active=False)
    for kind in (DueWorkKind.TOPUPS, DueWorkKind.RELAY):
        DueWork.objects.create(tenant_id=tenant_b.schema_name, kind=kind, due_at=timezone.now() - timedelta(seconds=1))
    assert topups_recover_due_tenants() == 1 and webhooks_relay_due_tenants() == 0
    assert queued(broker) == {"recovery": [("payments.topups_recover_tenant", tenant_b.schema_name)]}
    broker.delete(*QUEUES)

    topups_recover_all_tenants()
    assert ("payments.topups_recover_tenant", tenant_b.schema_name) in queued(broker)["recovery"]
    broker.delete(*QUEUES)

    with django_capture_on_commit_callbacks(execute=True):
        reconciliation_run_all_tenants()
    runs = {
        headers["_schema_name"]: json.loads(base64.b64decode(body))[1]
        for headers, body in ((m["headers"], m["body"]) for m in map(json.loads, broker.lrange("reconciliation", 0, -1)))
    }
    assert runs[tenant_b.schema_name].get("check_names") == ["psp_settlement"], runs
    assert "check_names" not in runs[tenant.schema_name], runs  # an active tenant: every check


def test_every_tally_task_is_routed_to_a_declared_queue() -> None:
    declared = set(settings.CELERY_TASK_QUEUES)
    assert declared == set(QUEUES)
    names = [n for n in current_app.tasks if n.split(".")[0] in {"webhooks", "payments", "idempotency", "reconciliation"}]
    assert len(names) >= 10
    for name in names:
        assert current_app.amqp.router.route({}, name)["queue"].name in declared, name


def test_the_procfiles_worker_consumes_every_queue() -> None:
    from devtools.localservices import ROOT
    from devtools.procfile import procfile_read

    (worker,) = [e for e in procfile_read(ROOT / "Procfile") if e.name == "worker"]
    assert f"-Q ${{CELERY_QUEUES:-{','.join(QUEUES)}}}" in worker.command


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_beat_sends_a_relay_only_to_the_tenants_with_due_work(broker: redis.Redis, tenant: Tenant, tenant_b: Tenant) -> None:
    DueWork.objects.all().delete()
    assert webhooks_relay_due_tenants() == 0 and topups_recover_due_tenants() == 0
    assert queued(broker) == {}
    run_atomic(lambda: outbox_event_create(topic="payment.succeeded", payload={"id": "pay_due4", "object": "payment"}), operation="test")
    DueWork.objects.create(tenant_id=tenant_b.schema_name, kind=DueWorkKind.TOPUPS, due_at=timezone.now() - timedelta(seconds=1))
    DueWork.objects.create(tenant_id=tenant_b.schema_name, kind=DueWorkKind.RELAY_LATER, due_at=timezone.now() + timedelta(hours=1))
    assert webhooks_relay_due_tenants() == 1 and topups_recover_due_tenants() == 1
    assert queued(broker) == {
        "webhooks": [("webhooks.relay_scheduled", tenant.schema_name)],
        "recovery": [("payments.topups_recover_tenant", tenant_b.schema_name)],
    }
