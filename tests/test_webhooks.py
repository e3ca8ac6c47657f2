"""The outbox relay and merchant webhook deliveries (SPEC 8), against real PostgreSQL and
real HTTP receivers on 127.0.0.1: at least once, never a rolled-back event, a relay or a
worker killed with SIGKILL loses nothing, each delivery on its own (a poison event, a
flapping or slow receiver hold nothing else back), two workers deliver each event once
per endpoint within its concurrency cap, retries, signatures, and no SSRF at registration
or at send time."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from django.db import connection, transaction
from django.utils import timezone

from payments.models import OutboxEvent
from payments.relaykick import _RelayKick
from payments.services.charges import payment_create
from payments.services.outbox import outbox_event_create
from tenants.models import Tenant
from tests.conftest import run_in_thread_tenant
from tests.factories import CustomerFactory, MerchantFactory, TerminalFactory, fund
from tests.receivers import doc_receiver, free_port, receiver_running
from wallets.models import Merchant
from wallets.transactions import run_atomic
from webhooks import metrics
from webhooks.errors import WebhookEndpointInvalid, WebhookTargetRefused, WebhookUrlNotAllowed
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpoint
from webhooks.services.deliveries import RETRY_WINDOW, retry_delay
from webhooks.services.endpoints import webhook_endpoint_create, webhook_endpoint_secret_rotate
from webhooks.services.relay import outbox_batch_publish, outbox_lag_seconds_refresh, outbox_relay_run
from webhooks.signing import signature_header
from webhooks.targets import address_refusal, webhook_target_resolve

ROOT = Path(__file__).resolve().parent.parent
RX = doc_receiver()


def _sample(metric: Any, suffix: str = "_total", **labels: str) -> float:
    return sum(
        s.value for m in metric.collect() for s in m.samples
        if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
def first_retry_after_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that count attempts run by run: the quick first retry (1-2 s) could come
    due while a slow run is still sending, so here it waits as the later ones do."""
    import webhooks.services.deliveries as deliveries

    monkeypatch.setattr(deliveries, "RETRY_FIRST_SECONDS", 30.0)


@pytest.fixture
def live_endpoints(live_tenant: Tenant) -> Iterator[list[WebhookEndpoint]]:
    """Endpoints a live test registers (they commit): disabled after it, so later tests'
    relays never call a receiver that is gone."""
    made: list[WebhookEndpoint] = []
    yield made
    WebhookEndpoint.objects.filter(pk__in=[e.pk for e in made]).update(status="disabled")


def _endpoint(merchant: Merchant, url: str, events: list[str] | None = None) -> tuple[WebhookEndpoint, str]:
    return webhook_endpoint_create(merchant=merchant, url=url, enabled_events=events or ["*"])


def _endpoint_as_registered(merchant: Merchant, url: str) -> WebhookEndpoint:
    """An endpoint row written directly, its URL unchecked (as registration saw it earlier)."""
    from webhooks.secrets import webhook_endpoint_secrets_assign

    endpoint = WebhookEndpoint(merchant=merchant, url=url, enabled_events=["*"])
    webhook_endpoint_secrets_assign(endpoint=endpoint, current="whsec_x", previous="")
    endpoint.save(force_insert=True)
    return endpoint


def _event(merchant: Merchant, n: int, topic: str = "payment.succeeded") -> OutboxEvent:
    """One committed event (own transaction when none is open)."""
    return run_atomic(
        lambda: outbox_event_create(topic=topic, payload={"id": f"pay_t{n}", "object": "payment", "merchant": merchant.pk, "amount": n}),
        operation="test_event",
    )


# --- the relay ------------------------------------------------------------------------


def test_relay_publishes_every_committed_event_never_a_rolled_back_one(live_tenant: Tenant, loopback_http: None, live_endpoints: list) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    merchant = terminal.store.merchant
    fund(customer, 1_000)
    with receiver_running() as rx:
        endpoint, secret = _endpoint(merchant, rx.url(), ["payment.succeeded"])
        live_endpoints.append(endpoint)
        paid = [payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=10) for _ in range(5)]
        with pytest.raises(RuntimeError), transaction.atomic():
            payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=11)  # writes its event...
            raise RuntimeError("...and rolls back")
        # Every commit kicked the relay (Celery eager in tests): delivered already.
        events = list(OutboxEvent.objects.filter(topic="payment.succeeded", payload__merchant=merchant.pk))
        assert sorted(e.payload["id"] for e in events) == sorted(p.id for p in paid)
        assert all(e.published_at is not None for e in events)
        assert sorted(rx.event_ids()) == sorted(e.id for e in events)
        for request in rx.requests:
            event = RX.verify(body=request.body, header=request.headers["Tally-Signature"], secrets=[secret])
            assert event["object"] == "event" and event["type"] == "payment.succeeded" and event["id"].startswith("evt_")
            assert event["data"]["object"]["amount"] == 10  # never the rolled-back 11
    assert WebhookDelivery.objects.filter(endpoint=endpoint, status=WebhookDeliveryStatus.SUCCEEDED).count() == 5


def test_the_kick_is_registered_once_per_transaction(live_tenant: Tenant) -> None:
    merchant = MerchantFactory()
    with transaction.atomic():
        _event(merchant, 1)
        _event(merchant, 2)
        kicks = [entry[1] for entry in connection.run_on_commit if isinstance(entry[1], _RelayKick)]
        assert len(kicks) == 1 and kicks[0].schema_name == live_tenant.schema_name


def _broker_pools_reset(app: Any) -> None:
    """Forget the app's broker pools (not close them: kombu shares them per URL), so the next
    publish connects to `broker_url` as set now."""
    app._pool = None
    app.amqp._producer_pool = None


def test_a_failed_kick_never_breaks_the_payment_and_the_sweep_catches_up(
    live_tenant: Tenant, loopback_http: None, live_endpoints: list, caplog: pytest.LogCaptureFixture
) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 100)
    app = current_app
    saved = (app.conf.task_always_eager, app.conf.broker_url)
    with receiver_running() as rx:
        endpoint, _ = _endpoint(terminal.store.merchant, rx.url())
        live_endpoints.append(endpoint)
        # The broker is down: send_task fails (no publish retries), after the commit.
        app.conf.task_always_eager, app.conf.broker_url = False, "redis://127.0.0.1:1/0"
        _broker_pools_reset(app)
        try:
            with caplog.at_level(logging.WARNING, logger="payments.relaykick"):
                started = time.monotonic()
                payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=7)
                assert time.monotonic() - started < 10
        finally:
            app.conf.task_always_eager, app.conf.broker_url = saved
            _broker_pools_reset(app)
        assert any("kick failed" in r.message for r in caplog.records)
        event = OutboxEvent.objects.get(topic="payment.succeeded", payload__id=payment.id)
        assert event.published_at is None and rx.requests == []
        # The beat sweep (fans out one relay per tenant; eager here).
        from webhooks.tasks import webhooks_relay_all_tenants

        webhooks_relay_all_tenants.apply()
        event.refresh_from_db()
        assert event.published_at is not None and rx.event_ids() == [event.id]


def _test_db_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE="config.settings.test", TALLY_TEST_DB_NAME=str(connection.settings_dict["NAME"]), **extra)
    return env


@pytest.mark.proof
def test_a_relay_killed_with_sigkill_mid_batch_loses_nothing(live_tenant: Tenant, loopback_http: None, live_endpoints: list, settings: Any) -> None:
    settings.TALLY_OUTBOX_RELAY_KICK = False  # only the relays below publish
    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, _ = _endpoint(merchant, rx.url())
        live_endpoints.append(endpoint)
        # Earlier tests on this database may have left committed, unpublished events in this
        # schema (their relays off). The relay claims the oldest 100 first, so without this
        # it could hold a batch without all of ours and the wait below would time out.
        OutboxEvent.objects.filter(published_at__isnull=True).update(published_at=timezone.now())
        events = [_event(merchant, n) for n in range(12)]
        ids = [e.id for e in events]
        relay = subprocess.Popen(  # a real relay process, holding its claimed batch for 120 s
            [sys.executable, "manage.py", "outbox_relay", "--schema", live_tenant.schema_name], cwd=ROOT,
            env=_test_db_env(TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS="120", TALLY_WEBHOOK_ALLOW_HTTP="1", TALLY_WEBHOOK_ALLOW_LOOPBACK="1"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            while True:  # wait until it holds every one of our rows
                # Read without locking: a probe that locked the rows (even FOR UPDATE SKIP
                # LOCKED, for an instant) could make the relay's SKIP LOCKED claim skip them.
                # A row another transaction has locked carries that transaction's id in xmax.
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM payments_outboxevent WHERE id = ANY(%s) AND xmax::text = '0'", [ids])
                    free = cursor.fetchone()[0]
                if free == 0:
                    break
                assert relay.poll() is None, relay.communicate()
                assert time.monotonic() < deadline, f"the relay never claimed the batch ({free} of ours free)"
                time.sleep(0.1)
            # Meanwhile another relay skips the claimed rows rather than waiting on them.
            outbox_batch_publish()
            assert not OutboxEvent.objects.filter(pk__in=ids, published_at__isnull=False).exists()
        finally:
            os.kill(relay.pid, signal.SIGKILL)
            out, err = relay.communicate()
        assert relay.returncode == -signal.SIGKILL, (out, err)
        # Its transaction died with it: nothing was published, nothing is lost.
        assert OutboxEvent.objects.filter(pk__in=ids, published_at__isnull=True).count() == 12
        # PostgreSQL ends the dead client's session (and frees its row locks) once it reads
        # the closed socket, a moment after the kill; until then SKIP LOCKED rightly skips them.
        deadline = time.monotonic() + 30
        while True:
            with transaction.atomic():
                free = len(OutboxEvent.objects.select_for_update(skip_locked=True).filter(pk__in=ids).values_list("pk", flat=True))
            if free == len(ids):
                break
            assert time.monotonic() < deadline, "the killed relay's session never ended"
            time.sleep(0.05)
        outbox_relay_run()  # the next relay
        assert OutboxEvent.objects.filter(pk__in=ids, published_at__isnull=False).count() == 12
        assert sorted(rx.event_ids()) == sorted(ids)


def _relay_process(schema_name: str, **env: str) -> subprocess.Popen[bytes]:
    """`manage.py outbox_relay` in its own process (a worker), against the test database."""
    return subprocess.Popen(
        [sys.executable, "manage.py", "outbox_relay", "--schema", schema_name], cwd=ROOT,
        env=_test_db_env(TALLY_WEBHOOK_ALLOW_HTTP="1", TALLY_WEBHOOK_ALLOW_LOOPBACK="1", **env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _published_before_the_test() -> None:
    """Earlier tests on this database may have left committed, unpublished events or due
    deliveries in this schema (their relays off): out of the way of this test's workers."""
    OutboxEvent.objects.filter(published_at__isnull=True).update(published_at=timezone.now())
    WebhookDelivery.objects.filter(status="pending").update(status="failed")


def test_two_worker_processes_deliver_each_event_once_per_endpoint_within_its_cap(
    live_tenant: Tenant, loopback_http: None, live_endpoints: list, settings: Any
) -> None:
    """Two real worker processes relay the same backlog at once: every event reaches each
    endpoint exactly once (no lease lost, none taken twice), and neither endpoint ever
    holds more requests at once than its cap, counted across both workers."""
    settings.TALLY_OUTBOX_RELAY_KICK = False
    merchant = MerchantFactory()
    _published_before_the_test()
    with receiver_running(delay=0.1) as rx:
        for path in ("/e1", "/e2"):
            endpoint = _endpoint(merchant, rx.url(path))[0]
            WebhookEndpoint.objects.filter(pk=endpoint.pk).update(max_concurrency=3)
            live_endpoints.append(endpoint)
        ids = [_event(merchant, n).id for n in range(60)]
        workers = [_relay_process(live_tenant.schema_name) for _ in range(2)]
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, (out, err)
        outbox_relay_run()  # nothing left, if the two did their work
        for path in ("/e1", "/e2"):
            received = rx.event_ids(path)
            assert sorted(received) == sorted(ids), path  # each once: no duplicate, none missing
            assert 1 < rx.max_in_flight[path] <= 3, rx.max_in_flight
    assert WebhookDelivery.objects.filter(event_id__in=ids, status="succeeded", attempts=1).count() == 120


def test_a_worker_killed_with_sigkill_mid_send_loses_nothing(
    live_tenant: Tenant, loopback_http: None, live_endpoints: list, settings: Any
) -> None:
    """A worker process is killed while its requests are at the receiver (the receiver holds
    them): the deliveries stay pending, leased; once the lease runs out the next worker
    sends them again, and each is delivered. At least once: the receiver got some twice."""
    settings.TALLY_OUTBOX_RELAY_KICK = False
    merchant = MerchantFactory()
    _published_before_the_test()
    with receiver_running(delay=5.0) as rx:
        endpoint = _endpoint(merchant, rx.url())[0]
        live_endpoints.append(endpoint)
        ids = [_event(merchant, n).id for n in range(6)]
        worker = _relay_process(live_tenant.schema_name, TALLY_WEBHOOK_LEASE_SECONDS="2")
        try:
            deadline = time.monotonic() + 60
            while rx.in_flight.get("/hook", 0) < 6:  # every delivery is mid-send
                assert worker.poll() is None, worker.communicate()
                assert time.monotonic() < deadline, "the worker never sent"
                time.sleep(0.05)
        finally:
            os.kill(worker.pid, signal.SIGKILL)
            worker.communicate()
        assert worker.returncode == -signal.SIGKILL
        rows = list(WebhookDelivery.objects.filter(endpoint=endpoint))
        assert len(rows) == 6 and all(d.status == "pending" and d.leased_until is not None and d.attempts == 0 for d in rows)
        rx.delay = 0.0
        outbox_relay_run()  # within the lease: nobody takes them
        assert WebhookDelivery.objects.filter(endpoint=endpoint, status="pending").count() == 6
        outbox_relay_run(now=timezone.now() + timedelta(seconds=3))  # the lease ran out
        assert WebhookDelivery.objects.filter(endpoint=endpoint, status="succeeded", attempts=1).count() == 6
        assert set(rx.event_ids()) == set(ids) and len(rx.event_ids()) == 12  # each sent twice, delivered once


def test_a_failing_publication_is_retried_then_dead_lettered_and_lag_is_measured(tenant: Tenant) -> None:
    merchant = MerchantFactory()
    event = _event(merchant, 1)
    OutboxEvent.objects.filter(pk=event.pk).update(created=timezone.now() - timedelta(seconds=90))
    assert outbox_lag_seconds_refresh() >= 90
    assert _sample(metrics.OUTBOX_LAG_SECONDS, "", tenant=tenant.schema_name) >= 90
    dead_before = _sample(metrics.OUTBOX_DEAD_LETTERS)
    _endpoint(merchant, "https://93.184.215.14/h")
    # A real database failure while publishing this one event (a trigger refusing its
    # delivery rows; DDL rolls back with the test's transaction).
    with connection.cursor() as cursor:
        cursor.execute("CREATE FUNCTION test_refuse_delivery() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected'; END $$")
        cursor.execute(
            "CREATE TRIGGER test_refuse_delivery BEFORE INSERT ON webhooks_webhookdelivery FOR EACH ROW "
            "WHEN (NEW.event_id = %s) EXECUTE FUNCTION test_refuse_delivery()", [event.pk],
        )
    other = _event(merchant, 2)
    later = timezone.now()
    for attempt in range(1, 9):
        outbox_relay_run(now=later)
        event.refresh_from_db()
        assert event.attempts == attempt and event.published_at is None and "injected" in event.last_error
        later = later + timedelta(hours=1)
    assert event.dead_at is not None
    assert _sample(metrics.OUTBOX_DEAD_LETTERS) == dead_before + 1
    other.refresh_from_db()
    assert other.published_at is not None  # one bad event never holds back the rest
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER test_refuse_delivery ON webhooks_webhookdelivery")
    # Requeued from the admin: it gets a new round (and, fixed, publishes).
    from webhooks.services.relay import outbox_event_requeue

    outbox_event_requeue(event=event)
    outbox_relay_run()
    event.refresh_from_db()
    assert event.published_at is not None and event.dead_at is None
    assert WebhookDelivery.objects.filter(event=event).count() == 1


# --- deliveries -------------------------------------------------------------------------


@pytest.mark.proof
def test_a_receiver_that_is_down_then_up_gets_the_event_after_retries(tenant: Tenant, loopback_http: None, first_retry_after_the_run: None) -> None:
    port = free_port()  # nothing listens there yet
    merchant = MerchantFactory()
    endpoint, secret = _endpoint(merchant, f"http://127.0.0.1:{port}/hook")
    event = _event(merchant, 1)
    failures_before = _sample(metrics.WEBHOOK_FAILURES, reason="network")
    outbox_relay_run()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint, event=event)
    assert delivery.status == "pending" and delivery.attempts == 1 and "Connection" in delivery.last_error
    assert delivery.next_attempt_at >= delivery.attempt_log.first().attempted_at + timedelta(seconds=1)  # backing off
    assert _sample(metrics.WEBHOOK_FAILURES, reason="network") == failures_before + 1
    outbox_relay_run()  # not due yet: no attempt
    assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 1
    outbox_relay_run(now=timezone.now() + timedelta(minutes=1))  # due, still down
    assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 2
    with receiver_running(port=port) as rx:
        outbox_relay_run(now=timezone.now() + timedelta(minutes=5))
    delivery.refresh_from_db()
    assert delivery.status == "succeeded" and delivery.attempts == 3 and delivery.last_status_code == 200
    assert rx.event_ids() == [event.id]
    assert RX.verify(body=rx.requests[0].body, header=rx.requests[0].headers["Tally-Signature"], secrets=[secret])["id"] == event.id
    log = list(delivery.attempt_log.order_by("attempted_at", "id"))
    assert [a.succeeded for a in log] == [False, False, True]
    assert log[-1].status_code == 200 and log[-1].response_excerpt == "ok" and log[-1].address == "127.0.0.1"
    assert all(a.latency_ms >= 0 for a in log) and log[0].status_code is None and log[0].error


def test_a_500_then_a_200_counts_as_one_success_and_the_receiver_handles_it_once(tenant: Tenant, loopback_http: None) -> None:
    merchant = MerchantFactory()
    succeeded_before = _sample(metrics.WEBHOOK_DELIVERIES, outcome="succeeded")
    with receiver_running(script=[500]) as rx:
        endpoint, secret = _endpoint(merchant, rx.url())
        event = _event(merchant, 1)
        outbox_relay_run()
        outbox_relay_run(now=timezone.now() + timedelta(minutes=1))
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "succeeded" and delivery.attempts == 2
    assert [a.status_code for a in delivery.attempt_log.order_by("attempted_at", "id")] == [500, 200]
    assert _sample(metrics.WEBHOOK_DELIVERIES, outcome="succeeded") == succeeded_before + 1
    # Both requests carry the same event (same id, same body); the copyable receiver
    # handles it once.
    assert rx.event_ids() == [event.id, event.id] and rx.requests[0].body == rx.requests[1].body
    dedupe, handled = RX.Dedupe(), []
    for request in rx.requests:
        verified = RX.verify(body=request.body, header=request.headers["Tally-Signature"], secrets=[secret])
        if dedupe.begin(verified["id"]) == "new":
            handled.append(verified["id"])
            dedupe.end(verified["id"], handled=True)
    assert handled == [event.id]


def test_redirects_are_not_followed(tenant: Tenant, loopback_http: None) -> None:
    merchant = MerchantFactory()
    with receiver_running(script=[302]) as rx:
        endpoint, _ = _endpoint(merchant, rx.url())
        _event(merchant, 1)
        outbox_relay_run()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "pending" and delivery.last_status_code == 302 and len(rx.requests) == 1


def test_an_endpoint_that_fails_everything_for_three_days_is_disabled(tenant: Tenant, loopback_http: None, first_retry_after_the_run: None) -> None:
    merchant = MerchantFactory()
    endpoint, _ = _endpoint(merchant, f"http://127.0.0.1:{free_port()}/hook")
    _event(merchant, 1)
    _event(merchant, 2)
    outbox_relay_run()
    # Each delivery on its own: both were tried, neither waits for the other.
    assert WebhookDelivery.objects.filter(endpoint=endpoint, attempts=1).count() == 2
    outbox_relay_run(now=timezone.now() + RETRY_WINDOW + timedelta(minutes=1))
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled" and "every delivery failed for 3 days" in endpoint.disabled_reason
    statuses = sorted(WebhookDelivery.objects.filter(endpoint=endpoint).values_list("status", flat=True))
    assert statuses == ["failed", "failed"]


def test_a_poison_event_holds_back_no_other_event_and_never_disables_the_endpoint(
    tenant: Tenant, loopback_http: None, first_retry_after_the_run: None
) -> None:
    """A receiver that always answers 500 to one event: every other event is delivered in
    the same run, the poison one is retried on its own schedule and, after 3 days, fails
    alone: the endpoint stays enabled (other events got through) and the failed delivery
    can be redelivered."""
    from webhooks.services.deliveries import webhook_delivery_redeliver

    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, _ = _endpoint(merchant, rx.url())
        poison = _event(merchant, 0)
        rx.refuse.add(poison.id)
        later = [_event(merchant, n) for n in range(1, 31)]
        outbox_relay_run()
        assert set(rx.event_ids()) == {poison.id, *(e.id for e in later)}
        rows = {d.event_id: d for d in WebhookDelivery.objects.filter(endpoint=endpoint)}
        assert all(rows[e.id].status == "succeeded" for e in later)
        stuck = rows[poison.id]
        assert (stuck.status, stuck.attempts, stuck.last_status_code) == ("pending", 1, 500)
        assert stuck.next_attempt_at >= stuck.attempt_log.first().attempted_at + timedelta(seconds=1)  # its own backoff
        # Two days on, more events get through while it waits; a day after that it gives up.
        more = [_event(merchant, n) for n in range(31, 36)]
        outbox_relay_run(now=timezone.now() + timedelta(days=2))
        assert {d.status for d in WebhookDelivery.objects.filter(event__in=more)} == {"succeeded"}
        outbox_relay_run(now=timezone.now() + RETRY_WINDOW + timedelta(minutes=1))
        stuck.refresh_from_db()
        endpoint.refresh_from_db()
        assert stuck.status == "failed" and stuck.attempts >= 3
        assert endpoint.status == "enabled" and endpoint.disabled_reason == ""
        # Fixed on the receiver's side: redelivered, it goes.
        rx.refuse.clear()
        webhook_delivery_redeliver(delivery=stuck)
        outbox_relay_run()
        stuck.refresh_from_db()
        assert stuck.status == "succeeded" and stuck.attempt_log.filter(succeeded=True).count() == 1


def test_a_flapping_receiver_gets_every_event(tenant: Tenant, loopback_http: None) -> None:
    """A receiver that answers 500 to the first attempt of each event, then 200: every event
    is retried on its own and delivered; none is left behind by another's failure."""
    merchant = MerchantFactory()
    with receiver_running(flap=True) as rx:
        endpoint, secret = _endpoint(merchant, rx.url())
        events = [_event(merchant, n) for n in range(20)]
        outbox_relay_run()
        # Every first attempt failed; a run that lasts past the quick first retry (1-2 s)
        # may already have sent some of them again.
        after_one_run = {(d.status, d.attempts) for d in WebhookDelivery.objects.filter(endpoint=endpoint)}
        assert after_one_run <= {("pending", 1), ("succeeded", 2)}
        outbox_relay_run(now=timezone.now() + timedelta(minutes=1))  # every first retry is due
    rows = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert {(d.status, d.attempts) for d in rows} == {("succeeded", 2)}
    assert sorted(rx.event_ids()) == sorted([e.id for e in events] * 2)
    for request in rx.requests:
        RX.verify(body=request.body, header=request.headers["Tally-Signature"], secrets=[secret])


def test_a_slow_receiver_gets_requests_at_once_up_to_the_endpoints_cap(tenant: Tenant, loopback_http: None, settings: Any) -> None:
    """A 200 ms receiver and 24 events: sent four at a time (the endpoint's cap), not one by
    one, on kept connections (at most one per request in flight)."""
    settings.TALLY_OUTBOX_RELAY_KICK = False
    from webhooks.services.deliveries import webhook_deliveries_dispatch

    merchant = MerchantFactory()
    with receiver_running(delay=0.2) as rx:
        endpoint, _ = _endpoint(merchant, rx.url())
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(max_concurrency=4)
        events = [_event(merchant, n) for n in range(24)]
        outbox_batch_publish()
        started = time.monotonic()
        assert webhook_deliveries_dispatch() == 24
        elapsed = time.monotonic() - started
        assert rx.max_in_flight["/hook"] == 4
        # One at a time cannot take less than 24 x 0.2 s = 4.8 s, whatever the machine's load;
        # four at a time takes about 1.2 s. The cap itself is shown by max_in_flight above.
        assert elapsed < 24 * 0.2, elapsed
        assert rx.connections <= 4 + 1  # kept connections, one per request in flight (and a spare)
    assert sorted(rx.event_ids()) == sorted(e.id for e in events)


def test_an_endpoint_with_a_huge_backlog_cannot_starve_another(tenant: Tenant, loopback_http: None, settings: Any) -> None:
    """One endpoint has 300 due deliveries to a slow receiver, another has 5: a dispatch with
    a short budget sends all five, while the first gets at most its cap at a time; the
    budget bounds the run (the backlog goes on in the next run, behind other tenants')."""
    settings.TALLY_OUTBOX_RELAY_KICK = False
    from webhooks.services.deliveries import webhook_deliveries_dispatch

    busy, quiet = MerchantFactory(), MerchantFactory()
    with receiver_running(delay=0.1) as rx:
        _endpoint(busy, rx.url("/busy"))
        _endpoint(quiet, rx.url("/quiet"))
        backlog = [_event(busy, n) for n in range(300)]
        outbox_batch_publish(batch_size=400)
        few = [_event(quiet, n) for n in range(5)]
        outbox_batch_publish()
        started = time.monotonic()
        webhook_deliveries_dispatch(time_budget_seconds=0.5)
        assert time.monotonic() - started < 0.5 + 2  # the budget, then what was in flight
        assert sorted(rx.event_ids("/quiet")) == sorted(e.id for e in few)
        assert rx.max_in_flight["/busy"] <= settings.TALLY_WEBHOOK_ENDPOINT_CONCURRENCY
        assert 0 < len(rx.event_ids("/busy")) < len(backlog)
        assert WebhookDelivery.objects.filter(event__in=backlog, status="pending").exists()


def test_events_carry_created_sequence_and_the_objects_state(tenant: Tenant, loopback_http: None) -> None:
    """Each event says when it happened, where it falls among its object's events, and the
    object as it left it; the copyable receiver keeps an object's latest state whatever
    order its events arrive in."""
    from webhooks.services.deliveries import webhook_event_body

    merchant = MerchantFactory()
    intent_states = ["created", "authorized", "captured"]
    events = [
        _event_of(merchant, "pi_seq", status, topic=f"payment_intent.{status}") for status in intent_states
    ] + [_event(merchant, 900)]
    assert [e.sequence for e in events] == [1, 2, 3, 1]
    assert [e.object_id for e in events] == ["pi_seq", "pi_seq", "pi_seq", "pay_t900"]
    bodies = [json.loads(webhook_event_body(event=e)) for e in events]
    for event, body in zip(events, bodies, strict=True):
        assert body["created"] == int(event.created.timestamp()) and body["sequence"] == event.sequence
        assert body["data"]["object"] == event.payload
    store = RX.ObjectStore()
    for body in reversed(bodies):  # the worst order
        store.apply(body)
    assert store.get("pi_seq")["status"] == "captured" and store.get("pay_t900")["amount"] == 900


def _event_of(merchant: Merchant, object_id: str, status: str, *, topic: str) -> OutboxEvent:
    payload = {"id": object_id, "object": "payment_intent", "status": status, "merchant": merchant.pk}
    return run_atomic(lambda: outbox_event_create(topic=topic, payload=payload), operation="test_event")


def test_retry_schedule_is_a_quick_first_retry_then_exponential_jittered_and_capped() -> None:
    for attempts, base in [(1, 2), (2, 30), (3, 60), (4, 120), (11, 15_360), (12, 6 * 3600), (30, 6 * 3600)]:
        for _ in range(20):
            assert base / 2 <= retry_delay(attempts=attempts).total_seconds() <= base


# --- signatures --------------------------------------------------------------------------


def test_signatures_verify_with_the_standard_library_and_fail_when_tampered_or_stale() -> None:
    body, now = b'{"id":"evt_1","object":"event"}', int(time.time())
    header = signature_header(secrets=["whsec_right"], timestamp=now, body=body)
    assert header.startswith(f"t={now},v1=")
    assert RX.verify(body=body, header=header, secrets=["whsec_right"])["id"] == "evt_1"
    with pytest.raises(RX.SignatureError):
        RX.verify(body=body.replace(b"evt_1", b"evt_2"), header=header, secrets=["whsec_right"])  # tampered body
    with pytest.raises(RX.SignatureError):
        RX.verify(body=body, header=header, secrets=["whsec_wrong"])  # wrong secret
    stale = signature_header(secrets=["whsec_right"], timestamp=now - 301, body=body)
    with pytest.raises(RX.SignatureError):
        RX.verify(body=body, header=stale, secrets=["whsec_right"])  # older than 300 s
    assert RX.verify(body=body, header=signature_header(secrets=["whsec_right"], timestamp=now - 299, body=body), secrets=["whsec_right"])
    with pytest.raises(RX.SignatureError):
        RX.verify(body=body, header="v1=abc", secrets=["whsec_right"])  # no timestamp


def test_during_a_rotation_overlap_deliveries_carry_both_signatures(tenant: Tenant, loopback_http: None) -> None:
    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, old_secret = _endpoint(merchant, rx.url())
        endpoint, new_secret = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(hours=1))
        _event(merchant, 1)
        outbox_relay_run()
    header = rx.requests[0].headers["Tally-Signature"]
    assert header.count("v1=") == 2
    for secret in (old_secret, new_secret):  # a receiver still on the old secret, or already on the new
        RX.verify(body=rx.requests[0].body, header=header, secrets=[secret])


def _raw_row(endpoint_id: str) -> bytes:
    """Every column of the endpoint's row as the database holds it (what a dump shows)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM webhooks_webhookendpoint WHERE id = %s", [endpoint_id])
        row = cursor.fetchone()
    assert row is not None
    return b"\x00".join(bytes(v) if isinstance(v, bytes | memoryview) else str(v).encode() for v in row)


def test_a_signing_secret_is_sealed_at_rest_and_deliveries_still_verify(tenant: Tenant, loopback_http: None) -> None:
    """Neither the secret nor the previous one (during a rotation's overlap) is in the row:
    a read-only dump of the database cannot sign for the merchant. Deliveries are signed
    with both, and the receiver verifies them."""
    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, old_secret = _endpoint(merchant, rx.url())
        assert old_secret.removeprefix("whsec_").encode() not in _raw_row(endpoint.pk)
        endpoint, new_secret = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(hours=1))
        raw = _raw_row(endpoint.pk)
        for secret in (old_secret, new_secret):
            assert secret.removeprefix("whsec_").encode() not in raw
        _event(merchant, 1)
        outbox_relay_run()
    header = rx.requests[0].headers["Tally-Signature"]
    for secret in (old_secret, new_secret):
        RX.verify(body=rx.requests[0].body, header=header, secrets=[secret])


def test_a_sealed_secret_opens_only_in_its_own_endpoint_and_field(tenant: Tenant) -> None:
    """Bound by associated data to the tenant, the endpoint and the field: copied to another
    endpoint's row, or from the previous secret's column to the current one, it does not open."""
    from cryptography.exceptions import InvalidTag

    from webhooks.secrets import webhook_endpoint_secrets

    merchant = MerchantFactory()
    first, _ = webhook_endpoint_create(merchant=merchant, url="https://93.184.215.14/a", enabled_events=["*"])
    first, _ = webhook_endpoint_secret_rotate(endpoint=first, overlap=timedelta(hours=1))
    second, _ = webhook_endpoint_create(merchant=merchant, url="https://93.184.215.14/b", enabled_events=["*"])
    WebhookEndpoint.objects.filter(pk=second.pk).update(secret_sealed=first.secret_sealed)
    with pytest.raises(InvalidTag):
        webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=second.pk))
    WebhookEndpoint.objects.filter(pk=first.pk).update(secret_sealed=first.previous_secret_sealed)
    with pytest.raises(InvalidTag):
        webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=first.pk))


def test_the_documented_receiver_is_the_file_make_run_starts() -> None:
    doc = (ROOT / "docs" / "WEBHOOKS.md").read_text()
    assert (ROOT / "devtools" / "webhook_receiver.py").read_text().strip() in doc
    assert "receiver:" in (ROOT / "Procfile").read_text()


# --- no SSRF -----------------------------------------------------------------------------

REFUSED = [
    "http://127.0.0.1/",
    "http://127.1/",  # inet_aton shorthand
    "http://2130706433/",  # 127.0.0.1 as one number
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://0.0.0.0/",
    "http://[::]/",
    "http://10.0.0.5/",
    "http://172.16.3.4/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",  # shared address space (some clouds' metadata)
    "http://[fd00:ec2::254]/",  # AWS metadata over IPv6 (unique local)
    "http://[fe80::1]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://240.0.0.1/",  # reserved
    "http://[fec0::1]/",  # site local (deprecated, not global; Python 3.11's is_global says it is)
    "http://192.0.0.8/",  # the IPv4 dummy address (IETF protocol assignments; Python 3.11 passes it)
    "http://localhost:6379/",  # a name that resolves to loopback
    "http://127.0.0.1:99999/",  # invalid port
    "http://127.0.0.1:0/",
    "ftp://93.184.215.14/",
    "https://user:pw@93.184.215.14/",
    # Does not resolve, whatever resolver runs the tests: .invalid is reserved (RFC 6761) and
    # the trailing dot makes it absolute (no search domain appended). Refused like the rest,
    # so no answer tells unknown from internal.
    "https://hooks.merchant.invalid./tally",
]
ACCEPTED = [
    "https://93.184.215.14/hooks",
    "http://93.184.215.14:8080/hooks",  # plain http only because this test's settings allow it
    "https://[2606:4700:4700::1111]/hooks",
]


@pytest.mark.parametrize("url", REFUSED)
def test_registration_refuses_internal_targets(url: str, tenant: Tenant, settings: Any) -> None:
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = False
    with pytest.raises(WebhookEndpointInvalid) as refused:
        _endpoint(MerchantFactory(), url)
    # One code and one message whatever the reason: a merchant cannot probe our DNS.
    assert type(refused.value) is WebhookUrlNotAllowed
    assert (refused.value.code, refused.value.message, refused.value.param) == ("webhook_url_not_allowed", WebhookUrlNotAllowed.MESSAGE, "url")


@pytest.mark.parametrize("url", ACCEPTED)
def test_registration_accepts_public_targets(url: str, tenant: Tenant, settings: Any) -> None:
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = False
    assert _endpoint(MerchantFactory(), url)[0].url == url


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("223.255.255.254", True),
        ("192.0.0.9", True),  # PCP anycast: the registry's one globally reachable 192.0.0.0/24 exception (with .10)
        ("192.0.0.170", False),  # NAT64 discovery
        ("192.0.2.1", False),  # documentation
        ("198.18.0.1", False),  # benchmarking
        ("192.88.99.1", False),  # 6to4 relay anycast, deprecated
        ("255.255.255.255", False),
        ("2001:4860:4860::8888", True),
        ("2001:db8::1", False),  # documentation
        ("3fff::1", False),  # documentation (the newer block)
        ("2001:2::1", False),  # benchmarking
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("2001:3::1", True),  # AMT: globally reachable inside 2001::/23
        ("4000::1", False),  # unassigned, outside 2000::/3
        ("::8.8.8.8", False),  # IPv4-compatible (deprecated): not a form that reaches 8.8.8.8
        ("::ffff:8.8.8.8", True),  # IPv4-mapped: judged as 8.8.8.8
        ("::ffff:192.0.0.8", False),
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
        ("64:ff9b::c000:8", False),  # NAT64 of 192.0.0.8
        ("64:ff9b:1::808:808", False),  # local-use NAT64 prefix
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
        ("2002:c000:8::1", False),  # 6to4 of 192.0.0.8
    ],
)
def test_only_addresses_on_the_global_allow_list_pass(address: str, allowed: bool) -> None:
    refusal = address_refusal(ipaddress.ip_address(address), allow_loopback=True)
    assert (refusal is None) is allowed, (address, refusal)


def test_loopback_only_when_a_setting_allows_it_and_never_private_or_unspecified(settings: Any) -> None:
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = True
    target = webhook_target_resolve(url="http://127.0.0.1:8765/hooks?x=1")
    assert target is not None and (target.address, target.port, target.path) == ("127.0.0.1", 8765, "/hooks?x=1")
    assert webhook_target_resolve(url="http://localhost:8765/") is not None
    for url in ("http://10.0.0.5/", "http://0.0.0.0/", "http://169.254.169.254/", "http://[fd00::1]/"):
        with pytest.raises(WebhookTargetRefused):
            webhook_target_resolve(url=url)
    settings.TALLY_WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(WebhookEndpointInvalid):
        webhook_target_resolve(url="http://127.0.0.1:8765/")


def test_a_delivery_to_a_name_that_resolves_to_an_internal_address_at_send_time_is_refused(tenant: Tenant, settings: Any) -> None:
    """Registered while the name pointed elsewhere (DNS rebinding): the row is written
    directly, as registration saw it. At send time the name resolves to 127.0.0.1, which
    this deployment does not allow: nothing is sent, and the attempt says why."""
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = False
    merchant = MerchantFactory()
    refused_before = _sample(metrics.WEBHOOK_FAILURES, reason="refused")
    with receiver_running() as rx:
        endpoints = [_endpoint_as_registered(merchant, url) for url in (f"http://localhost:{rx.port}/hook", "http://10.1.2.3/hook")]
        _event(merchant, 1)
        outbox_relay_run()
    assert rx.requests == []
    for endpoint in endpoints:
        delivery = WebhookDelivery.objects.get(endpoint=endpoint)
        assert delivery.status == "pending" and delivery.last_error.startswith("refused:")
        assert delivery.attempt_log.get().address == ""  # never connected
    assert _sample(metrics.WEBHOOK_FAILURES, reason="refused") == refused_before + 2


# --- Celery configured for money -----------------------------------------------------------


def test_celery_is_configured_for_money() -> None:
    from django.conf import settings

    conf = current_app.conf
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert 0 < conf.task_soft_time_limit < conf.task_time_limit
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit
    schedule = settings.CELERY_BEAT_SCHEDULE["webhooks-relay"]
    assert schedule["task"] == "webhooks.relay_due_tenants"
    assert float(schedule["schedule"]) < conf.broker_transport_options["visibility_timeout"]  # type: ignore[arg-type]
    sweep = settings.CELERY_BEAT_SCHEDULE["webhooks-relay-sweep"]
    assert sweep["task"] == "webhooks.relay_all_tenants"
    assert float(sweep["schedule"]) < conf.broker_transport_options["visibility_timeout"]  # type: ignore[arg-type]
    assert {"webhooks.outbox_relay", "webhooks.relay_scheduled", "webhooks.relay_due_tenants", "webhooks.relay_all_tenants"} <= set(current_app.tasks)


def test_a_batch_of_events_with_no_delivery_to_make_is_published_with_one_update(tenant: Tenant) -> None:
    """The relay's cost must not grow by statements per event when an event makes no
    delivery (no endpoint of its merchant wants it): one claim, one endpoint read, one
    UPDATE for the batch. An endpoint that wants an event still gets its delivery."""
    from django.test.utils import CaptureQueriesContext

    quiet, listening = MerchantFactory(), MerchantFactory()
    _endpoint(listening, "https://93.184.215.14/h")
    events = [_event(quiet, n) for n in range(12)]
    wanted = _event(listening, 99)
    with CaptureQueriesContext(connection) as queries:
        claimed, published = outbox_batch_publish()
    assert (claimed, published) == (13, 13)
    updates = [q["sql"] for q in queries if q["sql"].startswith("UPDATE") and "payments_outboxevent" in q["sql"]]
    assert len(updates) == 1, updates
    # A savepoint for the batch's block (inside the test's transaction) and one for the one
    # event that makes a delivery; none for the twelve that make none.
    assert sum(q["sql"].startswith("SAVEPOINT") for q in queries) == 2
    for event in [*events, wanted]:
        event.refresh_from_db()
        assert event.published_at is not None and event.attempts == 1 and event.last_error == ""
    assert WebhookDelivery.objects.filter(event=wanted).count() == 1
    assert not WebhookDelivery.objects.filter(event__in=events).exists()


def test_a_batch_of_events_makes_all_its_deliveries_with_one_insert(tenant: Tenant) -> None:
    """Per batch, not per event: one savepoint and one INSERT of deliveries for every
    event that makes any (the events below go to two endpoints of two merchants)."""
    from django.test.utils import CaptureQueriesContext

    first, second = MerchantFactory(), MerchantFactory()
    _endpoint(first, "https://93.184.215.14/a")
    _endpoint(first, "https://93.184.215.14/b", events=["refund.succeeded"])
    _endpoint(second, "https://93.184.215.14/c")
    events = [_event(first if n % 2 else second, n) for n in range(10)]
    with CaptureQueriesContext(connection) as queries:
        assert outbox_batch_publish() == (10, 10)
    inserts = [q["sql"] for q in queries if q["sql"].startswith("INSERT") and "webhooks_webhookdelivery" in q["sql"]]
    assert len(inserts) == 1, inserts
    assert sum(q["sql"].startswith("SAVEPOINT") for q in queries) == 2  # the batch's block, the insert's
    assert WebhookDelivery.objects.filter(event__in=events).count() == 10  # /b wants no payment events
    assert not WebhookDelivery.objects.filter(endpoint__url__endswith="/b").exists()


def _published_for_one_endpoint(count: int, rx: Any) -> tuple[WebhookEndpoint, list[OutboxEvent]]:
    merchant = MerchantFactory()
    endpoint, _ = _endpoint(merchant, rx.url())
    events = [_event(merchant, n) for n in range(count)]
    outbox_batch_publish()
    return endpoint, events


def test_a_dispatch_records_each_deliverys_own_attempt(tenant: Tenant, loopback_http: None) -> None:
    """45 deliveries answered 200, 201, 202, 203 (in whatever order they arrive): each
    delivery's row says exactly when it was delivered and what it was answered, its own
    attempt's; one attempt row each."""
    from webhooks.models import WebhookDeliveryAttempt
    from webhooks.services.deliveries import webhook_deliveries_dispatch

    with receiver_running(script=[(200, 201, 202, 203)[n % 4] for n in range(45)]) as rx:
        endpoint, events = _published_for_one_endpoint(45, rx)
        assert webhook_deliveries_dispatch() == 45
    for delivery in WebhookDelivery.objects.filter(event__in=events):
        attempt = WebhookDeliveryAttempt.objects.get(delivery=delivery)
        assert (delivery.status, delivery.attempts, delivery.last_error, delivery.leased_until) == ("succeeded", 1, "", None)
        assert delivery.delivered_at == delivery.last_attempt_at == attempt.attempted_at and attempt.succeeded
        assert delivery.last_status_code == attempt.status_code
    assert sorted(WebhookDeliveryAttempt.objects.filter(delivery__endpoint=endpoint).values_list("status_code", flat=True)) == sorted(
        (200, 201, 202, 203)[n % 4] for n in range(45)
    )


def test_a_failure_among_successes_holds_back_nothing(tenant: Tenant, loopback_http: None) -> None:
    from webhooks.models import WebhookDeliveryAttempt
    from webhooks.services.deliveries import webhook_deliveries_dispatch

    with receiver_running(script=[200, 200, 503]) as rx:
        _, events = _published_for_one_endpoint(5, rx)
        before = timezone.now()
        assert webhook_deliveries_dispatch() == 5  # every one tried, whichever failed
        assert len(rx.requests) == 5
    rows = list(WebhookDelivery.objects.filter(event__in=events))
    assert sorted(d.status for d in rows) == ["pending"] + ["succeeded"] * 4
    [failed] = [d for d in rows if d.status == "pending"]
    assert (failed.attempts, failed.last_status_code, failed.last_error, failed.leased_until) == (1, 503, "HTTP 503", None)
    assert failed.next_attempt_at >= before + timedelta(seconds=1)
    assert WebhookDeliveryAttempt.objects.filter(delivery__event__in=events).count() == 5


def test_a_dispatch_cut_short_records_what_it_had_in_flight(tenant: Tenant, loopback_http: None, monkeypatch: Any) -> None:
    """A soft time limit striking between claims: what was already sent is waited for and
    recorded (not sent again later); what was never claimed is still pending, unleased."""
    from celery.exceptions import SoftTimeLimitExceeded

    from webhooks.services import deliveries

    real_claim, calls = deliveries._deliveries_claim, []

    def claim_then_time_out(*, now: Any, limit: int, refill: Any = None) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise SoftTimeLimitExceeded()
        return real_claim(now=now, limit=min(limit, 2), refill=refill)

    monkeypatch.setattr(deliveries, "_deliveries_claim", claim_then_time_out)
    with receiver_running(delay=0.2) as rx:
        _, events = _published_for_one_endpoint(4, rx)
        with pytest.raises(SoftTimeLimitExceeded):
            deliveries.webhook_deliveries_dispatch()
        assert len(rx.requests) == 2
    rows = list(WebhookDelivery.objects.filter(event__in=events))
    assert sorted((d.status, d.attempts, d.leased_until is None) for d in rows) == [("pending", 0, True)] * 2 + [("succeeded", 1, True)] * 2


def test_a_record_that_fails_after_its_commit_is_not_recorded_again(tenant: Tenant, loopback_http: None, monkeypatch: Any) -> None:
    """An error striking once outcomes have committed (a soft time limit, a connection lost
    during COMMIT) must not have the dispatch's `finally` record them again: one attempt
    row per send, attempts counted once."""
    from webhooks.models import WebhookDeliveryAttempt
    from webhooks.services import deliveries

    real_count = deliveries._outcomes_count

    def count_then_fail(counted: Any) -> None:  # runs once the round's record has committed
        real_count(counted)
        if counted:
            raise RuntimeError("struck after the commit")

    monkeypatch.setattr(deliveries, "_outcomes_count", count_then_fail)
    with receiver_running() as rx:
        _, events = _published_for_one_endpoint(3, rx)
        with pytest.raises(RuntimeError):
            deliveries.webhook_deliveries_dispatch()
    for delivery in WebhookDelivery.objects.filter(event__in=events):
        attempts = WebhookDeliveryAttempt.objects.filter(delivery=delivery).count()
        assert attempts == delivery.attempts <= 1
        assert delivery.status == ("succeeded" if attempts else "pending")


def test_no_lock_is_held_while_a_request_is_at_the_receiver(live_tenant: Tenant, loopback_http: None, live_endpoints: list, settings: Any) -> None:
    """While a worker's requests sit at a slow receiver, another session can lock the
    endpoint and its deliveries at once (NOWAIT), and the worker holds no advisory lock:
    the claim committed before the requests went."""
    settings.TALLY_OUTBOX_RELAY_KICK = False
    merchant = MerchantFactory()
    _published_before_the_test()
    with receiver_running(delay=2.0) as rx:
        endpoint = _endpoint(merchant, rx.url())[0]
        live_endpoints.append(endpoint)
        ids = [_event(merchant, n).id for n in range(3)]
        outbox_batch_publish()
        worker_pid: list[int] = []

        def relay() -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                worker_pid.append(cursor.fetchone()[0])
            outbox_relay_run()

        worker = threading.Thread(target=run_in_thread_tenant, args=(live_tenant, relay))
        worker.start()
        try:
            deadline = time.monotonic() + 30
            while rx.in_flight.get("/hook", 0) < 3:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            with transaction.atomic():
                WebhookEndpoint.objects.select_for_update(nowait=True).get(pk=endpoint.pk)
                assert len(WebhookDelivery.objects.select_for_update(nowait=True).filter(event_id__in=ids)) == 3
            with connection.cursor() as cursor:  # the worker's session, not others' on this shared server
                cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", worker_pid)
                assert cursor.fetchone()[0] == 0
        finally:
            worker.join(timeout=30)
    assert WebhookDelivery.objects.filter(event_id__in=ids, status="succeeded").count() == 3


def test_a_relay_run_that_spends_its_budget_queues_its_tenant_again(tenant: Tenant, loopback_http: None, settings: Any, monkeypatch: Any) -> None:
    """Fairness between tenants: a run sends for its budget only, then frees its worker
    process and queues another run of its tenant at the back of the queue, behind the
    other tenants' runs, while deliveries are still due. A run that finishes its work
    queues nothing."""
    from webhooks import tasks

    settings.TALLY_WEBHOOK_DISPATCH_SECONDS = 0.3
    merchant = MerchantFactory()
    queued: list[str] = []
    with receiver_running(delay=0.1) as rx:
        _endpoint(merchant, rx.url())
        [_event(merchant, n) for n in range(100)]
        monkeypatch.setattr(tasks.webhooks_outbox_relay, "delay", lambda *args, **kwargs: queued.append(connection.schema_name))
        eager, current_app.conf.task_always_eager = current_app.conf.task_always_eager, False
        try:
            started = time.monotonic()
            tasks.webhooks_outbox_relay.run()
            assert time.monotonic() - started < 0.3 + 2  # the budget, then what was in flight
            assert queued == [tenant.schema_name]
            assert 0 < len(rx.requests) < 100
            WebhookDelivery.objects.filter(status="pending").update(status="failed")
            tasks.webhooks_outbox_relay.run()
            assert queued == [tenant.schema_name]
        finally:
            current_app.conf.task_always_eager = eager


# --- no event dropped while an endpoint is disabled ---------------------------------------


def test_a_disabled_endpoints_events_wait_and_go_when_it_is_enabled_again(tenant: Tenant, loopback_http: None) -> None:
    """While disabled, the endpoint's deliveries are made (its event-type filter still
    applies) and wait: not sent, not leased, not counted, no relay work due for them.
    Enabled again, those inside their 3-day window go; one whose window closed meanwhile is
    kept as `expired`, and is redeliverable."""
    from webhooks.selectors import relay_work_next_due_at
    from webhooks.services.deliveries import webhook_delivery_redeliver
    from webhooks.services.endpoints import webhook_endpoint_update

    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, _ = _endpoint(merchant, rx.url(), ["payment.succeeded"])
        webhook_endpoint_update(endpoint=endpoint, status="disabled")
        old = _event(merchant, 0)
        events = [_event(merchant, n) for n in range(1, 4)]
        _event(merchant, 9, topic="payment.refunded")  # not a type the endpoint takes
        outbox_relay_run()
        outbox_relay_run(now=timezone.now() + timedelta(hours=1))
        assert rx.requests == []
        waiting = WebhookDelivery.objects.filter(endpoint=endpoint)
        assert sorted(d.event_id for d in waiting) == sorted(e.id for e in [old, *events])
        assert {(d.status, d.attempts, d.leased_until) for d in waiting} == {("pending", 0, None)}
        assert relay_work_next_due_at(now=timezone.now()) is None  # nothing for beat to wake up for
        # The oldest waited past its window (published 3 days and a minute ago).
        long_ago = timezone.now() - RETRY_WINDOW - timedelta(minutes=1)
        WebhookDelivery.objects.filter(event=old).update(created=long_ago, give_up_at=long_ago + RETRY_WINDOW)
        webhook_endpoint_update(endpoint=endpoint, status="enabled")  # marks the relay due (test_beat_due_work.py)
        assert relay_work_next_due_at(now=timezone.now()) is not None
        outbox_relay_run()
        assert sorted(rx.event_ids()) == sorted(e.id for e in events)
        expired = WebhookDelivery.objects.get(event=old)
        assert (expired.status, expired.attempts) == ("expired", 0) and expired.last_error.startswith("expired:")
        assert {d.status for d in WebhookDelivery.objects.filter(event__in=events)} == {"succeeded"}
        webhook_delivery_redeliver(delivery=expired)  # shown, not deleted: staff or the merchant send it again
        outbox_relay_run()
        assert WebhookDelivery.objects.get(pk=expired.pk).status == "succeeded" and rx.event_ids().count(old.id) == 1


def test_events_after_an_endpoint_is_disabled_for_failing_three_days_wait_for_it(
    tenant: Tenant, loopback_http: None, first_retry_after_the_run: None
) -> None:
    """Disabled automatically after 3 days of failures: the events that follow are not
    dropped; once the receiver is back and the endpoint enabled, they are delivered."""
    from webhooks.services.endpoints import webhook_endpoint_update

    merchant, port = MerchantFactory(), free_port()
    endpoint, _ = _endpoint(merchant, f"http://127.0.0.1:{port}/hook")
    _event(merchant, 1)
    outbox_relay_run()
    outbox_relay_run(now=timezone.now() + RETRY_WINDOW + timedelta(minutes=1))
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled"
    later = [_event(merchant, n) for n in range(2, 5)]
    outbox_relay_run()
    assert {(d.status, d.attempts) for d in WebhookDelivery.objects.filter(event__in=later)} == {("pending", 0)}
    with receiver_running(port=port) as rx:
        webhook_endpoint_update(endpoint=endpoint, status="enabled")
        outbox_relay_run()
    assert sorted(rx.event_ids()) == sorted(e.id for e in later)
    assert {d.status for d in WebhookDelivery.objects.filter(event__in=later)} == {"succeeded"}


# --- waiting deliveries: the expiry sweep, a cheap re-enable, no deadlock, no quick re-disable ----


def _waiting(endpoint: WebhookEndpoint, events: list[OutboxEvent], *, window_closed: bool) -> None:
    """Make the endpoint's deliveries of `events` as if made 3 days ago (window closed) or now."""
    made = timezone.now() - RETRY_WINDOW - timedelta(minutes=1) if window_closed else timezone.now()
    WebhookDelivery.objects.filter(endpoint=endpoint, event__in=events).update(created=made, next_attempt_at=made, give_up_at=made + RETRY_WINDOW)


def test_a_periodic_sweep_expires_a_disabled_endpoints_deliveries_past_their_window_in_batches(tenant: Tenant) -> None:
    """Nobody re-enables the endpoint: beat's relay run (the task) still marks what waited
    out its window `expired` (a never-attempted one says why; an attempted one keeps its
    last error), batch by batch, and leaves what is in its window waiting."""
    from webhooks import tasks
    from webhooks.services.deliveries import webhook_waiting_deliveries_expire
    from webhooks.services.endpoints import webhook_endpoint_update

    merchant = MerchantFactory()
    endpoint, _ = _endpoint(merchant, "https://93.184.215.14/hook")
    webhook_endpoint_update(endpoint=endpoint, status="disabled")
    old, tried, fresh = [_event(merchant, n) for n in range(5)], _event(merchant, 5), [_event(merchant, n) for n in range(6, 8)]
    outbox_batch_publish()
    _waiting(endpoint, [*old, tried], window_closed=True)
    WebhookDelivery.objects.filter(event=tried).update(attempts=3, last_error="HTTP 503")
    assert webhook_waiting_deliveries_expire(batch_size=2, max_batches=1) == 2  # a bounded run: the next goes on
    tasks.webhooks_relay_scheduled.run()
    statuses = {d.event_id: (d.status, d.last_error) for d in WebhookDelivery.objects.filter(endpoint=endpoint)}
    assert {statuses[e.id][0] for e in old} == {"expired"} and all(statuses[e.id][1].startswith("expired:") for e in old)
    assert statuses[tried.id] == ("expired", "HTTP 503")  # its real last error kept
    assert {statuses[e.id] for e in fresh} == {("pending", "")}


def test_enabling_again_does_not_rewrite_the_backlog(tenant: Tenant) -> None:
    """Re-enabling touches only the few deliveries that were waiting for a retry (made due
    now); the rest of the backlog is due already, and what waited out its window is left to
    the sweep or the claim: the request's work does not grow with the backlog."""
    from webhooks.services.endpoints import webhook_endpoint_update

    merchant = MerchantFactory()
    endpoint, _ = _endpoint(merchant, "https://93.184.215.14/hook")
    webhook_endpoint_update(endpoint=endpoint, status="disabled")
    backlog, closed, retrying = [_event(merchant, n) for n in range(20)], _event(merchant, 20), _event(merchant, 21)
    outbox_batch_publish()
    _waiting(endpoint, [closed], window_closed=True)
    later = timezone.now() + timedelta(hours=2)
    WebhookDelivery.objects.filter(event=retrying).update(attempts=4, next_attempt_at=later, last_error="HTTP 500")

    def versions() -> dict[str, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT event_id, xmin::text FROM webhooks_webhookdelivery WHERE endpoint_id = %s", [endpoint.pk])
            return dict(cursor.fetchall())

    before = versions()
    webhook_endpoint_update(endpoint=endpoint, status="enabled")
    after = versions()
    assert [e for e in before if before[e] != after[e]] == [retrying.id]  # one row written, not the backlog
    assert WebhookDelivery.objects.get(event=retrying).next_attempt_at <= timezone.now()
    assert WebhookDelivery.objects.get(event=closed).status == "pending"  # the claim (or sweep) expires it
    assert {d.status for d in WebhookDelivery.objects.filter(event__in=backlog)} == {"pending"}


def test_a_delivery_that_waited_out_its_window_is_expired_by_the_claim_not_sent(tenant: Tenant, loopback_http: None) -> None:
    """Enabled again before any sweep ran: the claim marks the delivery whose window closed
    while the endpoint was disabled `expired` instead of sending it, and sends the rest."""
    from webhooks.services.endpoints import webhook_endpoint_update

    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, _ = _endpoint(merchant, rx.url())
        webhook_endpoint_update(endpoint=endpoint, status="disabled")
        closed, live = [_event(merchant, n) for n in range(3)], [_event(merchant, n) for n in range(3, 5)]
        outbox_batch_publish()
        _waiting(endpoint, closed, window_closed=True)
        webhook_endpoint_update(endpoint=endpoint, status="enabled")
        outbox_relay_run()
    assert sorted(rx.event_ids()) == sorted(e.id for e in live)
    assert {(d.status, d.attempts) for d in WebhookDelivery.objects.filter(event__in=closed)} == {("expired", 0)}


def test_an_endpoint_enabled_again_is_not_disabled_again_by_a_delivery_that_waited(
    tenant: Tenant, loopback_http: None, first_retry_after_the_run: None
) -> None:
    """A delivery that waited while the endpoint was disabled gives up minutes after it is
    enabled again: nothing was delivered in the last 3 days (the endpoint was disabled), but
    that is no reason to disable it again. The endpoint gets its own window from `enabled_at`."""
    from webhooks.services.endpoints import webhook_endpoint_update

    merchant = MerchantFactory()
    endpoint, _ = _endpoint(merchant, f"http://127.0.0.1:{free_port()}/hook")
    long_ago = timezone.now() - timedelta(days=10)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(created=long_ago, enabled_at=long_ago)
    webhook_endpoint_update(endpoint=endpoint, status="disabled")
    event = _event(merchant, 1)
    outbox_batch_publish()
    webhook_endpoint_update(endpoint=endpoint, status="enabled")
    WebhookDelivery.objects.filter(event=event).update(give_up_at=timezone.now() + timedelta(seconds=30))
    outbox_relay_run(now=timezone.now() + timedelta(minutes=1))  # fails, and its window is over
    assert WebhookDelivery.objects.get(event=event).status == "failed"
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.disabled_reason) == ("enabled", "")
    assert endpoint.enabled_at is not None and endpoint.enabled_at > long_ago
    # Past the window since it was enabled, failing everything still disables it.
    second = _event(merchant, 2)
    outbox_relay_run()
    outbox_relay_run(now=timezone.now() + RETRY_WINDOW + timedelta(minutes=2))
    assert WebhookDelivery.objects.get(event=second).status == "failed"
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).status == "disabled"


def test_redeliver_and_enable_again_at_once_never_deadlock(live_tenant: Tenant, loopback_http: None, settings: Any) -> None:
    """A redelivery and a re-enable of the same endpoint, at once, many rounds, on real
    connections: both lock the endpoint's row before the delivery's, so neither ever waits
    on the other in a cycle (PostgreSQL would abort one with a deadlock)."""
    from django.db import OperationalError

    from webhooks.errors import WebhookDeliveryNotRedeliverable
    from webhooks.services.deliveries import webhook_delivery_redeliver
    from webhooks.services.endpoints import webhook_endpoint_update

    settings.TALLY_OUTBOX_RELAY_KICK = False  # no relay runs in the threads: only the two services race
    merchant = MerchantFactory()
    endpoint, _ = _endpoint(merchant, f"http://127.0.0.1:{free_port()}/hook")
    _event(merchant, 1)
    outbox_batch_publish()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    rounds, errors, stop = 150, [], threading.Event()

    def toggle() -> None:
        for _ in range(rounds):
            if stop.is_set():
                return
            webhook_endpoint_update(endpoint=WebhookEndpoint.objects.get(pk=endpoint.pk), status="disabled")
            webhook_endpoint_update(endpoint=WebhookEndpoint.objects.get(pk=endpoint.pk), status="enabled")

    def redeliver() -> None:
        for _ in range(rounds):
            if stop.is_set():
                return
            # As a delivery waiting for its retry: the re-enable makes it due (writes its row).
            WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
            try:
                webhook_delivery_redeliver(delivery=delivery)
            except WebhookDeliveryNotRedeliverable:
                pass  # it caught the endpoint disabled: fine, it took the locks all the same

    def guarded(fn: Any) -> Any:
        def body() -> None:
            try:
                run_in_thread_tenant(live_tenant, fn)
            except OperationalError as exc:  # DeadlockDetected
                errors.append(exc)
                stop.set()
        return body

    threads = [threading.Thread(target=guarded(fn)) for fn in (toggle, redeliver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors
