"""Card top-ups as a crash-safe saga (SPEC 1.1, 1.5, 6, 8), each test against the real PSP
simulator process (devtools/psp_simulator.py) and real PostgreSQL, with
committed data: a slow PSP, a PSP 5xx and a timeout after the PSP charged each converge
to one charge and one credit; the web process killed with SIGKILL between the charge and
the completion is recovered; a stalled first attempt cannot overwrite the result;
duplicate and out-of-order PSP webhooks apply once; the settlement report matches."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client

from idempotency.models import IdempotencyRecord
from payments.models import PspWebhookEvent, TopUp
from payments.tasks import topups_recover_all_tenants, topups_recover_due_tenants
from tenants.models import DueWork, DueWorkKind, Tenant
from tests.conftest import TENANT_A, psp_account_configure, run_in_thread_tenant
from tests.live import live_redis_env
from tests.psp_sim import Simulator
from tests.receivers import free_port
from wallets.models import Account, LedgerTransaction
from wallets.selectors import account_balance
from wallets.services.principals import api_key_create, customer_create

ROOT = Path(__file__).resolve().parent.parent
WEBHOOK_SECRET = "whsec_live_1"


@dataclass
class Live:
    sim: Simulator
    psp_key: str
    customer: Any
    key: str

    def post(self, idem: str, body: dict[str, Any], client: Client | None = None) -> Any:
        client = client or Client(HTTP_HOST=TENANT_A["domain"])
        return client.post("/v1/customer/topups", data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {self.key}", HTTP_IDEMPOTENCY_KEY=idem)

    def balance(self) -> int:
        connection.set_schema(TENANT_A["schema_name"])
        return account_balance(account=Account.objects.get(customer=self.customer), asset_code="JPY")[0]

    def charges(self) -> list[dict[str, Any]]:
        return self.sim.charges(self.psp_key)

    def credits(self, topup_id: str) -> int:
        connection.set_schema(TENANT_A["schema_name"])
        return LedgerTransaction.objects.filter(kind="topup", reference=topup_id).count()

    def only_topup(self) -> TopUp:
        connection.set_schema(TENANT_A["schema_name"])
        topups = list(TopUp.objects.filter(customer=self.customer))
        assert len(topups) == 1, topups
        return topups[0]


@pytest.fixture
def live(live_tenant: Tenant, psp_simulator: Simulator, settings: Any) -> Iterator[Live]:
    settings.TALLY_PSP_TIMEOUT_SECONDS = 1.0
    settings.TALLY_TOPUP_LEASE_SECONDS = 2
    settings.TALLY_OUTBOX_RELAY_KICK = False
    psp_simulator.faults_clear()
    psp_key = psp_account_configure(psp_simulator, webhook_secrets=[WEBHOOK_SECRET])
    customer = customer_create(name=f"Card {uuid.uuid4().hex[:8]}")
    yield Live(sim=psp_simulator, psp_key=psp_key, customer=customer, key=api_key_create(principal=customer)[1])
    psp_simulator.faults_clear()
    connection.set_tenant(live_tenant)


def visa(amount: int = 1000) -> dict[str, Any]:
    return {"asset": "JPY", "amount": amount, "payment_method": "pm_card_visa"}


def recover(until: Callable[[], bool] | None = None, timeout: float = 20.0) -> None:
    """The beat task (eager in tests), run until `until` holds."""
    deadline = time.monotonic() + timeout
    while True:
        topups_recover_all_tenants.apply()
        connection.set_schema(TENANT_A["schema_name"])
        if until is None or until():
            return
        assert time.monotonic() < deadline, "recovery did not converge"
        time.sleep(0.3)


def assert_replays(live: Live, idem: str, body: dict[str, Any], first: Any) -> None:
    again = live.post(idem, body)
    assert again.status_code == first.status_code and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"


# --- Inline outcomes -------------------------------------------------------------------------


def test_a_top_up_charges_once_credits_once_and_replays(live: Live) -> None:
    idem = uuid.uuid4().hex
    r = live.post(idem, visa(1500))
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "succeeded" and body["amount"] == 1500
    assert live.balance() == 1500 and live.credits(body["id"]) == 1
    assert [c["idempotency_key"] for c in live.charges()] == [body["id"]]  # our top-up id is the PSP's key
    assert_replays(live, idem, visa(1500), r)
    assert len(live.charges()) == 1 and live.balance() == 1500


def test_a_decline_answers_402_and_the_402_replays(live: Live) -> None:
    idem = uuid.uuid4().hex
    body = {"asset": "JPY", "amount": 700, "payment_method": "pm_card_declined"}
    r = live.post(idem, body)
    assert r.status_code == 402 and r.json()["error"]["code"] == "card_declined"
    topup = live.only_topup()
    assert topup.status == "failed" and topup.failure_code == "card_declined" and live.balance() == 0
    assert_replays(live, idem, body, r)
    assert len(live.charges()) == 1


@pytest.mark.parametrize("asset", ["CARBON", "POINT"])
def test_top_ups_buy_currency_only(live: Live, asset: str) -> None:
    r = live.post(uuid.uuid4().hex, {"asset": asset, "amount": 100, "payment_method": "pm_card_visa"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "asset_not_top_upable" and r.json()["error"]["param"] == "asset"
    connection.set_schema(TENANT_A["schema_name"])
    assert not TopUp.objects.filter(customer=live.customer).exists()
    assert not IdempotencyRecord.objects.filter(principal_id=live.customer.pk).exists()
    assert live.charges() == []


def test_a_slow_psp_converges_to_one_charge_and_one_credit(live: Live) -> None:
    live.sim.faults(latency_ms=2500)  # beyond our 1 s timeout: the PSP charges after we gave up
    idem = uuid.uuid4().hex
    r = live.post(idem, visa())
    assert r.status_code == 503 and r.json()["error"]["code"] == "psp_unavailable" and r["Retry-After"]
    live.sim.faults(latency_ms=0)
    deadline = time.monotonic() + 10
    while not live.charges():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    again = live.post(idem, visa())  # the client's retry, same key
    assert again.status_code == 201, again.content
    topup_id = again.json()["id"]
    assert len(live.charges()) == 1 and live.credits(topup_id) == 1 and live.balance() == 1000
    assert_replays(live, idem, visa(), again)


def test_a_psp_5xx_converges_to_one_charge_and_one_credit(live: Live) -> None:
    live.sim.faults(fail_5xx=1)
    idem = uuid.uuid4().hex
    r = live.post(idem, visa())
    assert r.status_code == 503 and r.json()["error"]["code"] == "psp_unavailable"
    assert live.charges() == [] and live.only_topup().status == "pending"
    again = live.post(idem, visa())
    assert again.status_code == 201
    assert len(live.charges()) == 1 and live.credits(again.json()["id"]) == 1 and live.balance() == 1000


@pytest.mark.proof
def test_a_timeout_after_the_psp_charged_is_recovered_without_the_client(live: Live) -> None:
    live.sim.faults(hang_after_charge=1, hang_seconds=3)
    idem = uuid.uuid4().hex
    r = live.post(idem, visa(1200))
    assert r.status_code == 503
    topup = live.only_topup()
    assert topup.status == "pending" and len(live.charges()) == 1  # charged; we never heard
    time.sleep(2.2)  # past the lease: the recovery's work
    recover(until=lambda: TopUp.objects.get(pk=topup.pk).status != "pending")
    assert live.credits(topup.pk) == 1 and live.balance() == 1200 and len(live.charges()) == 1
    replay = live.post(idem, visa(1200))  # the client comes back: the recovered answer
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true" and replay.json()["id"] == topup.pk
    recover()  # a second pass changes nothing
    assert live.credits(topup.pk) == 1 and len(live.charges()) == 1


def test_a_retry_after_an_unheard_charge_refuses_the_credit_but_never_strands_the_money(live: Live) -> None:
    """The first attempt charged and never heard back; the wallet is frozen before the
    client retries. The retry may not refuse up front (it cannot know the card was not
    charged): it asks the PSP with the same key, records the charge, refuses the credit
    (402 wallet_frozen) and the card is refunded once. It used to refuse before asking:
    charged, never credited, never refunded."""
    from payments.services.freezes import wallet_freeze
    from payments.services.refunds import topup_refunds_run
    from wallets.services.principals import staff_member_get_or_create

    live.sim.faults(hang_after_charge=1, hang_seconds=3)
    idem = uuid.uuid4().hex
    assert live.post(idem, visa(1300)).status_code == 503
    topup = live.only_topup()
    assert topup.status == "pending" and len(live.charges()) == 1  # charged; we never heard
    wallet_freeze(customer=live.customer, staff=staff_member_get_or_create(username=f"ops-{idem[:8]}"), reason="test")
    again = live.post(idem, visa(1300))
    assert again.status_code == 402 and again.json()["error"]["code"] == "wallet_frozen", again.content
    topup.refresh_from_db()
    assert topup.status == "failed" and topup.psp_reference == live.charges()[0]["id"]
    assert live.balance() == 0 and live.credits(topup.pk) == 0
    assert topup_refunds_run()["refunded"] == 1 and topup_refunds_run()["refunded"] == 0
    refunds = live.sim.state()["accounts"][live.psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(topup.psp_reference, 1300)] and len(live.charges()) == 1


def test_a_refusal_decided_before_a_webhook_credited_answers_the_credit(live: Live) -> None:
    """The early refusal check is a read: if a webhook credits the top-up between it and the
    completion, the answer must be the credit, not a 402 (a client told 402 pays again)."""
    from payments.services import topups
    from wallets.errors import WalletFrozen

    r = live.post(uuid.uuid4().hex, visa(600))
    assert r.status_code == 201
    with transaction.atomic():  # the fenced completion's transaction
        topup, refusal = topups.topup_refuse(topup_id=r.json()["id"], refusal=WalletFrozen("the wallet is frozen", param=None))
    assert topup.status == "succeeded" and refusal is None and live.credits(topup.pk) == 1


def test_the_stored_answer_is_what_the_customer_face_renders() -> None:
    """The request's view and the recovery both store `topup_answer`: its bytes are the
    customer face's own rendering of the top-up (TopUpOut) and of a refusal (the error
    envelope and status of apikit.errors), so a replay answers what a live request would."""
    from rest_framework.renderers import JSONRenderer

    from apikit.errors import envelope, http_status_of
    from payments.api.serializers import TopUpOut
    from payments.errors import CardDeclined, PspRefused
    from payments.models import TopUpStatus
    from payments.services.topup_saga import topup_answer
    from wallets.errors import CapExceeded, WalletFrozen

    topup = TopUp(
        id="top_answer", customer_id="cus_answer", asset_id="JPY", amount=1_200, bonus_amount=12, payment_method="pm_card_visa \u00fc\u2028",
        status=TopUpStatus.SUCCEEDED, created=datetime(2026, 12, 6, 5, 4, 3, 21, tzinfo=UTC),
    )
    credited = topup_answer(topup=topup, refusal=None, request_id="req_live")
    assert (credited.status, credited.headers) == (201, {"Content-Type": "application/json"})
    assert credited.body == JSONRenderer().render(TopUpOut(topup).data)
    topup.status, topup.failure_code = TopUpStatus.FAILED, "card_declined"
    refusals = [
        CardDeclined("the card was declined (card_declined)", param="payment_method"),
        PspRefused("the card processor did not take this top-up: nothing was charged \u00e9", param=None),
        CapExceeded("the wallet's JPY balance would exceed its cap", param="amount"),
        WalletFrozen("the wallet is frozen", param=None),
    ]
    for refusal in refusals:
        refused = topup_answer(topup=topup, refusal=refusal, request_id="req_live")
        status, error_type = http_status_of(refusal)
        data = envelope(error_type=error_type, code=str(refusal.code), message=refusal.message, param=refusal.param, request_id="req_live")
        assert (refused.status, refused.headers, refused.body) == (status, {"Content-Type": "application/json"}, JSONRenderer().render(data))


def test_a_top_up_past_the_psps_key_window_is_never_charged_again(live: Live) -> None:
    """A PSP forgets idempotency keys (Stripe after 24 h): a charge asked again after that
    could be a second one. Past PSP_KEY_TRUSTED_FOR the top-up waits in the operator queue."""
    from datetime import timedelta

    from django.utils import timezone

    live.sim.faults(fail_5xx=1)
    idem = uuid.uuid4().hex
    assert live.post(idem, visa(400)).status_code == 503
    topup = live.only_topup()
    TopUp.objects.filter(pk=topup.pk).update(created=timezone.now() - timedelta(hours=21))
    again = live.post(idem, visa(400))
    assert again.status_code == 503 and again.json()["error"]["code"] == "psp_unavailable"
    assert live.charges() == [] and live.only_topup().status == "pending"
    assert live.only_topup().operator_review_at is not None  # in the operator queue


# --- SIGKILL between the PSP call and the completion ------------------------------------------


def _gunicorn(live_tenant: Tenant, port: int, **extra: str) -> subprocess.Popen[bytes]:
    database = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING",
        DATABASE_URL=f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}",
        PORT=str(port), WEB_CONCURRENCY="1", TENANT_CACHE_SECONDS="0", TALLY_OUTBOX_RELAY_KICK="false",
        TALLY_TOPUP_LEASE_SECONDS="2", TALLY_PSP_TIMEOUT_SECONDS="5", **live_redis_env(), **extra,
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.2)


@pytest.fixture
def web(live_tenant: Tenant) -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], int]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(**extra: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        server = _gunicorn(live_tenant, port, **extra)
        started.append(server)
        _warm_up(port)
        return server, port

    yield start
    for server in started:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=20)


def _warm_up(port: int) -> None:
    """One request through the whole stack (an unsigned webhook: 400), so the first real one is not slow."""
    request = f"POST /v1/psp/webhooks/simulator HTTP/1.1\r\nHost: {TENANT_A['domain']}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode())
        while sock.recv(65536):
            pass


def _post_raw(port: int, key: str, idem: str, body: dict[str, Any]) -> None:
    """Send a top-up to gunicorn and wait for whatever comes back (nothing, if it is killed)."""
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/customer/topups HTTP/1.1\r\nHost: {TENANT_A['domain']}\r\nAuthorization: Bearer {key}\r\n"
        f"Idempotency-Key: {idem}\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\nConnection: close\r\n\r\n"
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(head.encode() + raw)
            while sock.recv(65536):
                pass
    except OSError:
        pass


@pytest.mark.proof
def test_web_killed_between_the_charge_and_the_completion_is_recovered_once(live: Live, web: Any) -> None:
    server, port = web(TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS="60")
    idem = uuid.uuid4().hex
    client_thread = threading.Thread(target=_post_raw, args=(port, live.key, idem, visa(2500)), daemon=True)
    client_thread.start()
    deadline = time.monotonic() + 30
    while not live.charges():  # the PSP has charged; the worker now sleeps before completing
        assert time.monotonic() < deadline, "the PSP was never called"
        time.sleep(0.05)
    os.killpg(server.pid, signal.SIGKILL)  # master and worker
    server.wait(timeout=10)
    client_thread.join(timeout=10)
    topup = live.only_topup()
    record = IdempotencyRecord.objects.get(principal_id=live.customer.pk, key=idem)
    assert topup.status == "pending" and record.state == "in_flight" and live.balance() == 0

    killed_at = time.monotonic()
    recover(until=lambda: IdempotencyRecord.objects.get(pk=record.pk).state == "completed")
    recovered_in = time.monotonic() - killed_at
    assert recovered_in < 20
    assert live.credits(topup.pk) == 1 and live.balance() == 2500 and len(live.charges()) == 1
    record.refresh_from_db()
    assert record.fence == 2 and record.response_status == 201

    replay = live.post(idem, visa(2500))  # the same final answer, from the record the recovery completed
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.content == bytes(record.response_body) and replay.json()["status"] == "succeeded"
    assert live.post(idem, visa(2500)).content == replay.content
    recover()
    assert live.credits(topup.pk) == 1 and len(live.charges()) == 1


# --- A stalled first attempt ------------------------------------------------------------------


def test_a_stalled_first_attempt_wakes_after_a_takeover_and_cannot_overwrite(
    live: Live, live_tenant: Tenant, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from payments.services import topup_saga

    # The first attempt stalls after the charge until the takeover has completed the record,
    # however slow the machine (a timed pause let a loaded machine wake it first).
    paused, released = threading.Event(), threading.Event()

    def pause(_seconds: float) -> None:
        paused.set()
        released.wait(timeout=60)

    monkeypatch.setattr(topup_saga, "time", SimpleNamespace(sleep=pause))
    settings.TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS = 1.0
    idem = uuid.uuid4().hex
    box: dict[str, Any] = {}

    def first() -> None:
        box["response"] = run_in_thread_tenant(live_tenant, lambda: live.post(idem, visa(800)))

    stalled = threading.Thread(target=first, daemon=True)
    stalled.start()
    # Paused, not merely charged: the setting is read after the PSP answers, so turning it
    # off once the charge shows could let a slow thread skip the pause and finish itself.
    assert paused.wait(20)
    assert len(live.charges()) == 1
    settings.TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS = 0.0
    time.sleep(2.2)  # its lease runs out while it sleeps
    recover(until=lambda: IdempotencyRecord.objects.get(principal_id=live.customer.pk, key=idem).state == "completed")
    record = IdempotencyRecord.objects.get(principal_id=live.customer.pk, key=idem)
    stored = (record.fence, record.response_status, bytes(record.response_body), record.completed_at)
    released.set()
    stalled.join(timeout=30)
    assert not stalled.is_alive()
    late = box["response"]
    # It woke, found its fence dead, wrote nothing, and answered what the record holds.
    assert late.status_code == 201 and late.content == stored[2] and late["Idempotent-Replayed"] == "true"
    record.refresh_from_db()
    assert (record.fence, record.response_status, bytes(record.response_body), record.completed_at) == stored
    topup = live.only_topup()
    assert live.credits(topup.pk) == 1 and live.balance() == 800 and len(live.charges()) == 1


# --- PSP webhooks through a live web process ---------------------------------------------------


def _webhook_url(port: int) -> str:
    return f"http://{TENANT_A['domain']}:{port}/v1/psp/webhooks/simulator"


def test_a_webhook_before_the_inline_answer_credits_once(live: Live, web: Any) -> None:
    _, port = web()
    live.sim.webhook_endpoint(live.psp_key, _webhook_url(port), WEBHOOK_SECRET)
    live.sim.faults(webhook_before_response=True)  # the event lands and is applied before our call returns
    r = live.post(uuid.uuid4().hex, visa(900))
    assert r.status_code == 201
    topup_id = r.json()["id"]
    events = PspWebhookEvent.objects.filter(gateway="simulator", type="charge.succeeded", outcome="applied")
    assert [e.event_id for e in events if e.event_id in {w["event"] for w in live.sim.webhooks()}]
    assert live.credits(topup_id) == 1 and live.balance() == 900 and len(live.charges()) == 1


def test_duplicate_and_out_of_order_webhooks_apply_once(live: Live, web: Any) -> None:
    _, port = web()
    live.sim.webhook_endpoint(live.psp_key, _webhook_url(port), WEBHOOK_SECRET)
    # The inline answers never arrive (a timeout after each charge): only the webhooks settle.
    live.sim.faults(hang_after_charge=2, hang_seconds=2, duplicate_webhooks=True, out_of_order_webhooks=True)
    ok, declined = uuid.uuid4().hex, uuid.uuid4().hex
    assert live.post(ok, visa(600)).status_code == 503
    assert live.post(declined, {"asset": "JPY", "amount": 50, "payment_method": "pm_card_declined"}).status_code == 503
    assert TopUp.objects.filter(customer=live.customer, status="pending").count() == 2
    assert live.sim.flush_webhooks() == 2  # newest first, each event twice
    deliveries = [w for w in live.sim.webhooks() if w["url"] == _webhook_url(port)]
    assert len(deliveries) == 4 and all(w["status"] == 200 for w in deliveries)
    event_ids = {w["event"] for w in deliveries}
    assert PspWebhookEvent.objects.filter(event_id__in=event_ids).count() == 2
    topups = {t.payment_method: t for t in TopUp.objects.filter(customer=live.customer)}
    assert topups["pm_card_visa"].status == "succeeded" and topups["pm_card_declined"].status == "failed"
    assert live.credits(topups["pm_card_visa"].pk) == 1 and live.balance() == 600
    # The clients' retries find them settled: same outcome, no second charge or credit.
    live.sim.faults(hang_after_charge=0)
    assert live.post(ok, visa(600)).status_code == 201
    assert live.post(declined, {"asset": "JPY", "amount": 50, "payment_method": "pm_card_declined"}).status_code == 402
    assert len(live.charges()) == 2 and live.credits(topups["pm_card_visa"].pk) == 1 and live.balance() == 600


# --- Charged, then refused by us: refunded ------------------------------------------------------


def test_a_charge_that_can_no_longer_be_credited_is_refused_and_refunded(tenant: Tenant, psp_simulator: Simulator, monkeypatch: Any) -> None:
    from payments.services import topups
    from payments.services.refunds import topup_refunds_run
    from wallets.models import Asset

    psp_key = psp_account_configure(psp_simulator)
    Asset.objects.filter(code="JPY").update(cap=1_500)
    customer = customer_create(name="Near cap")
    key = api_key_create(principal=customer)[1]
    # The early check passes (as if the balance grew between it and the credit: a race).
    monkeypatch.setattr(topups, "topup_refusal_check", lambda **kwargs: None)
    client = Client(HTTP_HOST=TENANT_A["domain"])
    idem = uuid.uuid4().hex
    body = json.dumps({"asset": "JPY", "amount": 2_000, "payment_method": "pm_card_visa"})
    r = client.post("/v1/customer/topups", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}",
                    HTTP_IDEMPOTENCY_KEY=idem)
    assert r.status_code == 402 and r.json()["error"]["code"] == "cap_exceeded"
    topup = TopUp.objects.get(customer=customer)
    assert topup.status == "failed" and topup.failure_code == "cap_exceeded" and topup.psp_reference
    assert LedgerTransaction.objects.filter(reference=topup.pk).count() == 0
    assert account_balance(account=Account.objects.get(customer=customer), asset_code="JPY")[0] == 0
    # The card was charged: the recovery gives the money back, once.
    assert topup_refunds_run()["refunded"] == 1 and topup_refunds_run()["refunded"] == 0
    topup.refresh_from_db()
    assert topup.psp_refund_reference.startswith("re_")
    state = psp_simulator.state()["accounts"][psp_key]
    assert [(rf["charge"], rf["amount"]) for rf in state["refunds"]] == [(topup.psp_reference, 2_000)]
    replay = client.post("/v1/customer/topups", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}",
                         HTTP_IDEMPOTENCY_KEY=idem)
    assert replay.status_code == 402 and replay.content == r.content


def test_a_crash_after_the_claim_before_the_psp_call_is_recovered_forward(live: Live) -> None:
    """The process died right after the claim committed: no charge exists. The recovery
    charges with the same key (the customer asked for it; the PSP dedupes if the dead
    attempt's call did get through) and completes the answer the client's retry replays."""
    from idempotency.canonical import fingerprint_compute
    from idempotency.engine import IdempotentCall
    from idempotency.entry import Claim, _claim_external
    from idempotency.selectors import IdempotencyPolicy
    from payments.services import topup_saga
    from payments.services.topups import topup_pending_ensure

    idem = uuid.uuid4().hex
    raw = json.dumps(visa(1300)).encode()
    call = IdempotentCall(
        principal_id=live.customer.pk, key=idem, scope="customer", request_id="req_dead",
        fingerprint=fingerprint_compute(method="POST", path="/v1/customer/topups", principal_id=live.customer.pk, body=raw),
        method="POST", path="/v1/customer/topups",
    )

    def on_claim(ctx: Any) -> None:
        topup_pending_ensure(topup_id=ctx.minted[topup_saga.MINT_NAME], customer=live.customer, asset_code="JPY", amount=1300,
                             payment_method="pm_card_visa", claim_principal_id=ctx.principal_id, claim_key=idem)

    claim = _claim_external(call=call, policy=IdempotencyPolicy(lease_seconds=1), mint={"topup": "top"}, on_claim=on_claim)
    assert isinstance(claim, Claim) and live.charges() == []
    time.sleep(1.2)
    topup_id = claim.context.minted["topup"]
    recover(until=lambda: TopUp.objects.get(pk=topup_id).status != "pending")
    assert live.credits(topup_id) == 1 and live.balance() == 1300 and len(live.charges()) == 1
    replay = Client(HTTP_HOST=TENANT_A["domain"]).post(
        "/v1/customer/topups", data=raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {live.key}", HTTP_IDEMPOTENCY_KEY=idem
    )
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true" and replay.json()["id"] == topup_id
    assert replay["Original-Request"] == "req_dead"


def test_a_claim_marks_its_tenant_for_recovery_and_beats_due_task_alone_recovers_it(live: Live) -> None:
    """The claim commits its tenant's recovery row (tenants.duework) with the top-up, due
    when the lease ends; beat's 10 s task, which reads only that table (not the safety
    sweep of every tenant), then recovers the top-up a crash left behind."""
    from django.utils import timezone

    from idempotency.engine import IdempotentCall
    from idempotency.entry import Claim, _claim_external
    from idempotency.selectors import IdempotencyPolicy
    from payments.services import topup_saga
    from payments.services.topups import topup_pending_ensure

    schema = TENANT_A["schema_name"]
    DueWork.objects.filter(tenant_id=schema, kind=DueWorkKind.TOPUPS).delete()
    idem = uuid.uuid4().hex
    call = IdempotentCall(principal_id=live.customer.pk, key=idem, scope="customer", request_id="req_due", fingerprint="d" * 64,
                          method="POST", path="/v1/customer/topups")

    def on_claim(ctx: Any) -> None:
        topup_pending_ensure(topup_id=ctx.minted[topup_saga.MINT_NAME], customer=live.customer, asset_code="JPY", amount=700,
                             payment_method="pm_card_visa", claim_principal_id=ctx.principal_id, claim_key=idem)

    claimed_at = timezone.now()
    claim = _claim_external(call=call, policy=IdempotencyPolicy(lease_seconds=1), mint={"topup": "top"}, on_claim=on_claim)
    assert isinstance(claim, Claim)
    (row,) = DueWork.objects.filter(tenant_id=schema, kind=DueWorkKind.TOPUPS)
    assert claimed_at < row.due_at <= timezone.now() + timedelta(seconds=2)  # the lease (TALLY_TOPUP_LEASE_SECONDS) ends
    topup_id = claim.context.minted["topup"]
    deadline = time.monotonic() + 20
    while TopUp.objects.get(pk=topup_id).status == "pending":
        assert time.monotonic() < deadline, "beat's due task did not recover the top-up"
        time.sleep(0.3)
        topups_recover_due_tenants.apply()
        connection.set_schema(schema)
    assert live.credits(topup_id) == 1 and len(live.charges()) == 1


# --- The PSP refusing the request: nothing charged, the top-up fails at once ------------------


def test_an_idempotency_conflict_at_the_psp_is_an_unknown_outcome_not_a_refusal(psp_simulator: Simulator) -> None:
    """The PSP's idempotency layer objecting (the key bound to other parameters) says
    nothing about the charge under that key: it must never fail a top-up as uncharged."""
    from payments.gateways.base import ChargeRequest, GatewayRejected, GatewayUnavailable
    from payments.gateways.simulator import SimulatorGateway

    psp_simulator.faults_clear()
    adapter = SimulatorGateway(api_base=psp_simulator.url, secret_key=f"sk_sim_{uuid.uuid4().hex}", timeout=5.0)
    key = f"top_{uuid.uuid4().hex}"
    first = ChargeRequest(amount=100, currency="JPY", payment_method="pm_card_visa", idempotency_key=key, reference=key)
    assert adapter.charge(first).status == "succeeded"
    with pytest.raises(GatewayUnavailable):
        adapter.charge(ChargeRequest(amount=200, currency="JPY", payment_method="pm_card_visa", idempotency_key=key, reference=key))
    psp_simulator.faults(min_charge_amount=50)
    with pytest.raises(GatewayRejected) as refused:
        adapter.charge(ChargeRequest(amount=10, currency="JPY", payment_method="pm_card_visa", idempotency_key=f"{key}_2", reference=key))
    psp_simulator.faults_clear()
    assert refused.value.code == "amount_too_small" and refused.value.param == "amount"


def test_a_psp_refusal_fails_the_top_up_at_once_with_a_402_that_replays(live: Live) -> None:
    """The PSP refuses the request itself (Stripe's `amount_too_small`): nothing was charged,
    and asking again is refused again. The top-up fails now with its own code, a 402 stored
    and replayed, not a 503 `psp_unavailable` with the top-up pending for good."""
    live.sim.faults(min_charge_amount=50)
    idem = uuid.uuid4().hex
    r = live.post(idem, visa(1))
    assert r.status_code == 402, r.content
    error = r.json()["error"]
    assert error["code"] == "psp_refused" and error["type"] == "payment_error" and error["param"] == "amount"
    assert "amount_too_small" in error["message"] and error["request_id"] == r["Request-Id"]
    topup = live.only_topup()
    assert topup.status == "failed" and topup.failure_code == "psp_refused" and "amount_too_small" in topup.last_error
    assert not topup.psp_charged and live.charges() == [] and live.balance() == 0
    assert_replays(live, idem, visa(1), r)
    assert live.charges() == []


def test_a_refusal_met_by_a_retry_or_the_recovery_fails_the_top_up_too(live: Live) -> None:
    """No answer first (503, pending), then the PSP refuses the same request: whoever asks
    next, the client's retry or the recovery, fails the top-up with `psp_refused`, and the
    answer the recovery stores is the one the client's retry replays."""
    live.sim.faults(fail_5xx=2)
    by_client, by_recovery = uuid.uuid4().hex, uuid.uuid4().hex
    assert live.post(by_client, visa(10)).status_code == 503
    assert live.post(by_recovery, visa(20)).status_code == 503
    live.sim.faults(min_charge_amount=50)
    again = live.post(by_client, visa(10))
    assert again.status_code == 402 and again.json()["error"]["code"] == "psp_refused"
    pending = TopUp.objects.get(customer=live.customer, amount=20)
    time.sleep(2.2)  # past the lease
    recover(until=lambda: TopUp.objects.get(pk=pending.pk).status != "pending")
    pending.refresh_from_db()
    assert pending.failure_code == "psp_refused" and live.charges() == []
    replay = live.post(by_recovery, visa(20))
    assert replay.status_code == 402 and replay["Idempotent-Replayed"] == "true" and replay.json()["error"]["code"] == "psp_refused"


# --- A charge recorded after the top-up failed, whatever the failure: refunded -----------------


def test_a_retry_that_cannot_reach_the_psp_leaves_a_maybe_charged_top_up_pending(live: Live, web: Any) -> None:
    """The first attempt charged and never heard back; the operator's gateway is gone when
    the client retries (403 `psp_not_configured`, the claim released). The retry cannot
    know the card was not charged, so the top-up stays pending (it used to fail as
    `request_invalid`, and nothing looked at it again); the PSP's late webhook credits it."""
    from payments.models import GatewayAccount
    from payments.services.topups import gateway_account_set

    _, port = web()
    live.sim.webhook_endpoint(live.psp_key, _webhook_url(port), WEBHOOK_SECRET)
    live.sim.faults(hang_after_charge=1, hang_seconds=3, out_of_order_webhooks=True)  # the event is held back
    idem = uuid.uuid4().hex
    assert live.post(idem, visa(900)).status_code == 503
    topup = live.only_topup()
    assert topup.status == "pending" and len(live.charges()) == 1
    GatewayAccount.objects.filter(gateway="simulator").delete()
    retry = live.post(idem, visa(900))
    assert retry.status_code == 403 and retry.json()["error"]["code"] == "psp_not_configured"
    topup.refresh_from_db()
    assert topup.status == "pending"
    gateway_account_set(gateway="simulator", api_base=live.sim.url, secret_key=live.psp_key, webhook_secrets=[WEBHOOK_SECRET])
    assert live.sim.flush_webhooks() == 1  # the late charge.succeeded
    topup.refresh_from_db()
    assert topup.status == "succeeded" and topup.psp_reference == live.charges()[0]["id"] and live.credits(topup.pk) == 1


def test_a_late_charge_on_a_top_up_failed_with_any_code_is_refunded_once(quiet: Simulator) -> None:
    """A top-up failed as `not_charged` (the PSP's search showed no charge yet) whose charge
    then surfaces: the charge is recorded on the failed top-up and the card refunded, once.
    Whatever the failure code, a charge on a failed top-up is refunded, never kept."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway
    from payments.locks import topup_lock
    from payments.services.refunds import topup_refunds_run
    from payments.services.topups import topup_fail, topup_settle

    psp_key = psp_account_configure(quiet)
    customer = customer_create(name=f"Late {uuid.uuid4().hex[:6]}")
    topup = _pending(customer, created=timezone.now() - timedelta(hours=1), amount=900)[0]
    with transaction.atomic():
        topup_fail(topup=topup_lock(topup_id=topup.pk), failure_code="not_charged")
    assert _topups_due() == []  # failed uncharged: nothing for the recovery
    adapter = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0)
    charge = adapter.charge(ChargeRequest(amount=900, currency="JPY", payment_method="pm_card_visa", idempotency_key=topup.pk,
                                          reference=topup.pk))
    with transaction.atomic():
        settled, _ = topup_settle(topup_id=topup.pk, result=charge)  # the late webhook's effect
    assert settled.status == "failed" and settled.failure_code == "not_charged" and settled.psp_charged
    assert len(_topups_due(by=timezone.now())) == 1  # the refund is due now: beat's 10 s task will send it
    assert topup_refunds_run()["refunded"] == 1
    assert topup_refunds_run().get("refunded", 0) == 0
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(charge.psp_reference, 900)]
    assert _balance(customer) == 0


# --- Recovery: every record reached, each one on its own ----------------------------------------

RECOVERY_TENANT = {"schema_name": "test_recovery", "domain": "recovery.test.localhost", "name": "Recovery", "main_currency": "JPY"}


@pytest.fixture(scope="session")
def recovery_tenant_committed(django_db_setup: None, django_db_blocker: Any) -> Tenant:
    from tenants.services import tenant_create

    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        tenant = Tenant.objects.filter(schema_name=RECOVERY_TENANT["schema_name"]).first() or tenant_create(**RECOVERY_TENANT)
        connection.set_schema_to_public()
        return tenant


@pytest.fixture
def quiet(db: None, recovery_tenant_committed: Tenant, psp_simulator: Simulator, settings: Any) -> Iterator[Simulator]:
    """A tenant no other test commits to, inside this test's rolled-back transaction: its
    recovery pass sees this test's top-ups and nothing else."""
    settings.TALLY_PSP_TIMEOUT_SECONDS = 1.0
    settings.TALLY_TOPUP_LEASE_SECONDS = 2
    settings.TALLY_OUTBOX_RELAY_KICK = False
    psp_simulator.faults_clear()
    connection.set_tenant(recovery_tenant_committed)
    yield psp_simulator
    psp_simulator.faults_clear()
    connection.set_schema_to_public()


def _pending(customer: Any, *, created: datetime, n: int = 1, amount: int = 500, gateway: str = "simulator") -> list[TopUp]:
    """Pending top-ups whose claim records are gone (the recovery settles them alone), made
    in one INSERT; `created` is set after it (the column is auto_now_add)."""
    rows = [
        TopUp(customer=customer, asset_id="JPY", amount=amount, payment_method="pm_card_visa", gateway=gateway,
              claim_principal_id=customer.pk, claim_key=f"gone-{uuid.uuid4().hex}")
        for _ in range(n)
    ]
    TopUp.objects.bulk_create(rows)
    TopUp.objects.filter(pk__in=[t.pk for t in rows]).update(created=created)
    return rows


def _unsealable_gateway() -> None:
    """A Stripe account row copied in from another tenant's schema: its credentials are
    sealed to that schema and do not open here."""
    from payments.gateways.credentials import credential_seal
    from payments.models import GatewayAccount
    from payments.services.topups import gateway_account_set

    gateway_account_set(gateway="stripe", api_base="http://127.0.0.1:9", secret_key="sk_x", webhook_secrets=["whsec_x"], active=False)
    sealed = credential_seal(value="sk_x", schema="another_tenant", gateway="stripe", field="secret_key")
    GatewayAccount.objects.filter(gateway="stripe").update(secret_key_sealed=sealed)


def _frozen_customer(name: str) -> Any:
    from payments.services.freezes import wallet_freeze
    from wallets.services.principals import staff_member_get_or_create

    customer = customer_create(name=name)
    wallet_freeze(customer=customer, staff=staff_member_get_or_create(username=f"ops-{uuid.uuid4().hex[:8]}"), reason="test")
    return customer


def _balance(customer: Any) -> int:
    return account_balance(account=Account.objects.get(customer=customer), asset_code="JPY")[0]


def _topups_due(*, by: datetime | None = None) -> list[DueWork]:
    """This tenant's top-up recovery rows (tenants.duework), due by `by` if given."""
    rows = DueWork.objects.filter(tenant_id=connection.schema_name, kind=DueWorkKind.TOPUPS)
    return list(rows.filter(due_at__lte=by) if by is not None else rows)


def test_what_makes_top_up_recovery_work_marks_its_tenant(quiet: Simulator) -> None:
    """A failed top-up the PSP charged (a refund is owed) and a client's retry of a top-up's
    key (a new lease on its record) are the recovery's work: each marks the tenant in its own
    transaction, so beat's 10 s task finds it without the safety sweep."""
    from django.utils import timezone

    from payments.locks import topup_lock
    from payments.services.topups import topup_fail, topup_pending_ensure

    psp_account_configure(quiet)
    customer = customer_create(name=f"Marks {uuid.uuid4().hex[:6]}")
    topup = _pending(customer, created=timezone.now() - timedelta(hours=1), amount=600)[0]
    DueWork.objects.filter(tenant_id=connection.schema_name).delete()
    with transaction.atomic():
        charged = topup_lock(topup_id=topup.pk)
        assert charged is not None
        charged.psp_reference, charged.psp_charged = "ch_marks", True
        charged.save(update_fields=["psp_reference", "psp_charged"])
        topup_fail(topup=charged, failure_code="cap_exceeded")  # charged, then the credit refused
    assert len(_topups_due(by=timezone.now())) == 1

    DueWork.objects.filter(tenant_id=connection.schema_name).delete()
    with transaction.atomic():
        topup_pending_ensure(topup_id=topup.pk, customer=customer, asset_code="JPY", amount=600, payment_method="pm_card_visa",
                             claim_principal_id=customer.pk, claim_key=topup.claim_key)
    assert len(_topups_due()) == 1


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_recovery_reaches_a_resolvable_top_up_behind_more_than_a_page_of_stuck_ones(quiet: Simulator) -> None:
    """105 older top-ups that cannot be resolved (60 past the PSP's key window, 45 whose
    gateway is gone; each group created in one instant, so pages split a tie), and a newer
    one the PSP would settle: one pass reaches it. The pass used to read the 100 oldest
    and stop."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.services.topup_saga import topup_recovery_run

    psp_account_configure(quiet)
    customer = customer_create(name=f"Starved {uuid.uuid4().hex[:6]}")
    now = timezone.now()
    _pending(customer, created=now - timedelta(days=2), n=60)
    _pending(customer, created=now - timedelta(hours=2), n=45, gateway="stripe")  # no such account here: no answer to be had
    resolvable = _pending(customer, created=now - timedelta(minutes=5), amount=700)[0]

    counts = topup_recovery_run()

    resolvable.refresh_from_db()
    assert resolvable.status == "succeeded" and _balance(customer) == 700, counts
    assert counts["succeeded"] == 1 and counts["operator_review"] == 60 and counts["unavailable"] == 45
    assert TopUp.objects.filter(customer=customer, operator_review_at__isnull=False, status="pending").count() == 60


def test_one_top_up_that_cannot_be_resolved_does_not_stop_the_recovery_run(quiet: Simulator) -> None:
    """The oldest pending top-up's gateway credentials do not unseal (an exception that is
    not the PSP's). It is logged, counted as an error and noted on the top-up; the pass
    still settles the others and purges old PSP event markers, and the charge it could not
    credit is refunded (by the next pass, which makes refunds first; the tenant stays due
    now). An exception used to end the tenant's whole run there."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.services.topup_saga import topup_recovery_run

    psp_key = psp_account_configure(quiet)
    _unsealable_gateway()
    customer, frozen = customer_create(name=f"Ok {uuid.uuid4().hex[:6]}"), _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}")
    now = timezone.now()
    broken = _pending(customer, created=now - timedelta(minutes=30), gateway="stripe")[0]
    refused = _pending(frozen, created=now - timedelta(minutes=20), amount=300)[0]
    fine = _pending(customer, created=now - timedelta(minutes=10), amount=400)[0]
    old_marker = PspWebhookEvent.objects.create(gateway="simulator", event_id=f"evt_{uuid.uuid4().hex}", type="charge.succeeded",
                                                outcome="applied", received=now - timedelta(days=40))
    errors_before = _sample("tally_topup_orphans_recovered_total", outcome="error")

    counts = topup_recovery_run()

    assert counts["error"] == 1 and counts["succeeded"] == 1 and counts["failed"] == 1 and counts["refunded"] == 0, counts
    assert _sample("tally_topup_orphans_recovered_total", outcome="error") == errors_before + 1
    assert _topups_due(by=timezone.now())
    assert topup_recovery_run()["refunded"] == 1
    broken.refresh_from_db()
    assert broken.status == "pending" and "InvalidTag" in broken.last_error
    fine.refresh_from_db()
    assert fine.status == "succeeded" and _balance(customer) == 400
    refused.refresh_from_db()
    assert refused.status == "failed" and refused.failure_code == "wallet_frozen" and refused.psp_refund_reference
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(refused.psp_reference, 300)]
    assert counts["webhook_markers_purged"] >= 1 and not PspWebhookEvent.objects.filter(pk=old_marker.pk).exists()


def test_one_card_refund_that_fails_does_not_stop_the_others(quiet: Simulator) -> None:
    """Two charges that could not be credited; the older one's refund raises (its gateway's
    credentials do not unseal). The other is refunded all the same, and the run goes on to
    the purge. The refund loop used to let such an exception end the run."""
    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway
    from payments.services.topup_saga import topup_recovery_run
    from payments.services.topups import topup_settle

    psp_key = psp_account_configure(quiet)
    _unsealable_gateway()
    frozen = _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}")
    adapter = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0)
    owed = []
    for amount in (250, 350):
        topup = TopUp.objects.create(customer=frozen, asset_id="JPY", amount=amount, payment_method="pm_card_visa", gateway="simulator")
        result = adapter.charge(ChargeRequest(amount=amount, currency="JPY", payment_method="pm_card_visa", idempotency_key=topup.pk,
                                              reference=topup.pk))
        with transaction.atomic():
            settled, refusal = topup_settle(topup_id=topup.pk, result=result)
        assert settled.status == "failed" and refusal is not None and settled.psp_reference
        owed.append(settled)
    TopUp.objects.filter(pk=owed[0].pk).update(gateway="stripe")  # its refund now meets the unsealable account

    counts = topup_recovery_run()

    assert counts["refunded"] == 1 and counts["refund_errors"] == 1 and "webhook_markers_purged" in counts, counts
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(owed[1].psp_reference, 350)]
    broken = TopUp.objects.get(pk=owed[0].pk)
    assert not broken.psp_refund_reference and "InvalidTag" in broken.last_error


# --- The operator queue: past the PSP's key window, a person settles it --------------------------

STAFF_PASSWORD = "pw-topup-queue-123"


def _staff_client(username: str, role: str) -> Client:
    from devtools.demo_seed import staff_login_ensure

    staff_login_ensure(username=username, password=STAFF_PASSWORD, role=role)
    client = Client(HTTP_HOST=RECOVERY_TENANT["domain"], REMOTE_ADDR="203.0.113.9")
    assert client.login(username=username, password=STAFF_PASSWORD)
    return client


def _confirmation_key(page: Any) -> str:
    import re

    match = re.search(rb'name="idempotency_key" value="([0-9a-f]+)"', page.content)
    assert match, page.content[:2000]
    return match.group(1).decode()


def test_a_top_up_past_the_key_window_waits_for_an_operator_who_settles_it_in_the_back_office(quiet: Simulator) -> None:
    """Two top-ups still pending past the PSP's key window: the recovery asks the PSP about
    neither again (a forgotten key could charge twice) and puts both in the operator queue,
    with their evidence. A finance staff member finds one charged at the PSP and credits it
    (a mistyped amount is refused), and fails the other as not charged; both audited."""
    from datetime import timedelta

    from django.contrib.admin.utils import quote
    from django.utils import timezone

    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway
    from payments.services.topup_saga import topup_recovery_run
    from wallets.models import AuditEntry

    psp_key = psp_account_configure(quiet)
    customer = customer_create(name=f"Queued {uuid.uuid4().hex[:6]}")
    now = timezone.now()
    charged = _pending(customer, created=now - timedelta(hours=21), amount=1500)[0]
    never = _pending(customer, created=now - timedelta(hours=22), amount=800)[0]
    # The first attempt at `charged` went through at the PSP, and its answer was lost.
    adapter = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0)
    psp_charge = adapter.charge(ChargeRequest(amount=1500, currency="JPY", payment_method="pm_card_visa", idempotency_key=charged.pk,
                                              reference=charged.pk))

    counts = topup_recovery_run()
    assert counts["operator_review"] == 2, counts
    assert len(quiet.charges(psp_key)) == 1  # nobody asked the PSP again
    assert _sample("tally_topups_operator_review", tenant=RECOVERY_TENANT["schema_name"]) == 2
    assert "operator_review" not in topup_recovery_run()  # queued: no longer the recovery's
    charged.refresh_from_db()
    assert charged.status == "pending" and charged.operator_review_at is not None and "key window" in charged.last_error

    finance, viewer = _staff_client("fin-queue", "finance"), _staff_client("view-queue", "viewer")
    queue = finance.get("/admin/payments/topup/?operator_queue=waiting")
    assert queue.status_code == 200 and charged.pk.encode() in queue.content and never.pk.encode() in queue.content
    page = finance.get(f"/admin/payments/topup/{quote(charged.pk)}/change/")
    assert page.status_code == 200 and b"act/settle/" in page.content
    assert charged.claim_key.encode() in page.content and b"waiting since" in page.content
    act = f"/admin/payments/topup/{quote(charged.pk)}/act/settle/"
    assert viewer.get(act).status_code == 403
    assert b"act/settle/" not in viewer.get(f"/admin/payments/topup/{quote(charged.pk)}/change/").content

    DueWork.objects.filter(tenant_id=RECOVERY_TENANT["schema_name"]).delete()
    done = finance.post(act, {"idempotency_key": _confirmation_key(finance.get(act)), "reason": "customer called"})
    assert done.status_code == 302, done.content[:2000]
    assert len(_topups_due(by=timezone.now())) == 1  # the queue shrank: the next pass refreshes its gauges
    charged.refresh_from_db()
    assert charged.status == "succeeded" and charged.psp_reference == psp_charge.psp_reference and charged.psp_charged
    assert _balance(customer) == 1500 + charged.bonus_amount
    audit = AuditEntry.objects.get(action="admin.settle", target_id=charged.pk)
    assert audit.actor == "user:fin-queue" and audit.reason == "customer called" and audit.after["status"] == "succeeded"

    fail = f"/admin/payments/topup/{quote(never.pk)}/act/settle/"
    failed = finance.post(fail, {"idempotency_key": _confirmation_key(finance.get(fail)), "reason": "customer called"})
    assert failed.status_code == 302
    never.refresh_from_db()
    assert never.status == "failed" and never.failure_code == "not_charged" and _balance(customer) == 1500 + charged.bonus_amount
    assert len(quiet.charges(psp_key)) == 1  # the PSP was read, never asked to charge
    topup_recovery_run()
    assert _sample("tally_topups_operator_review", tenant=RECOVERY_TENANT["schema_name"]) == 0
    assert b"act/settle/" not in finance.get(f"/admin/payments/topup/{quote(never.pk)}/change/").content


def test_an_operator_settles_only_a_queued_top_up_and_only_by_the_psps_records(quiet: Simulator) -> None:
    """Nothing a person types decides a settlement: a charge of another amount, or two
    successful charges, settle nothing; a top-up not in the queue is not the operator's."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway
    from payments.services.topup_review import topup_review_settle
    from payments.services.topups import topup_review_hold
    from wallets.errors import InvalidState

    psp_key = psp_account_configure(quiet)
    adapter = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0)
    customer = customer_create(name=f"Not queued {uuid.uuid4().hex[:6]}")
    fresh = _pending(customer, created=timezone.now() - timedelta(minutes=1))[0]
    with pytest.raises(InvalidState):
        topup_review_settle(topup_id=fresh.pk, reason="too early")  # the saga and the recovery are still at it
    odd, queued = _pending(customer, created=timezone.now() - timedelta(hours=21), n=2)
    for topup in (odd, queued):
        assert topup_review_hold(topup_id=topup.pk, reason="test")
    assert not topup_review_hold(topup_id=queued.pk, reason="again")
    # The PSP holds a charge of another amount under `odd`'s id: not this top-up's charge.
    adapter.charge(ChargeRequest(amount=999, currency="JPY", payment_method="pm_card_visa", idempotency_key=odd.pk, reference=odd.pk))
    with pytest.raises(InvalidState, match="does not match"):
        topup_review_settle(topup_id=odd.pk, reason="x")
    assert TopUp.objects.get(pk=odd.pk).status == "pending" and _balance(customer) == 0
    topup, refusal = topup_review_settle(topup_id=queued.pk, reason="x")
    assert topup.status == "failed" and topup.failure_code == "not_charged" and refusal is None
    with pytest.raises(InvalidState):
        topup_review_settle(topup_id=queued.pk, reason="settled already")


def test_an_operator_fails_a_queued_mismatched_top_up_and_the_psps_charge_is_refunded(quiet: Simulator) -> None:
    """A pending top-up held for a charge of another amount (the PSP keeps reporting it
    succeeded; the settlement refuses it) could never leave the operator queue. A finance
    staff member fails it from the back office; the charge is recorded with the PSP's
    amount, and the recovery refunds exactly that, once; audited. A viewer cannot."""
    from django.contrib.admin.utils import quote
    from django.utils import timezone

    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway
    from payments.services.topup_saga import topup_recovery_run
    from payments.services.topups import topup_charge_mismatch_hold
    from wallets.models import AuditEntry

    psp_key = psp_account_configure(quiet)
    customer = customer_create(name=f"Mismatch {uuid.uuid4().hex[:6]}")
    odd = _pending(customer, created=timezone.now() - timedelta(hours=1), amount=1000)[0]
    adapter = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0)
    charge = adapter.charge(ChargeRequest(amount=1700, currency="JPY", payment_method="pm_card_visa", idempotency_key=odd.pk,
                                          reference=odd.pk))
    assert topup_charge_mismatch_hold(topup_id=odd.pk, result=charge, source="test")

    finance, viewer = _staff_client("fin-mismatch", "finance"), _staff_client("view-mismatch", "viewer")
    act = f"/admin/payments/topup/{quote(odd.pk)}/act/fail_refund/"
    assert b"act/fail_refund/" in finance.get(f"/admin/payments/topup/{quote(odd.pk)}/change/").content
    assert viewer.get(act).status_code == 403
    done = finance.post(act, {"idempotency_key": _confirmation_key(finance.get(act)), "reason": "PSP charged 1700"})
    assert done.status_code == 302, done.content[:2000]
    odd.refresh_from_db()
    assert odd.status == "failed" and odd.failure_code == "charge_refunded" and odd.psp_reference == charge.psp_reference
    assert (odd.psp_charged, odd.psp_charged_amount, odd.psp_charged_currency) == (True, 1700, "JPY")
    assert _balance(customer) == 0 and LedgerTransaction.objects.filter(reference=odd.pk).count() == 0
    audit = AuditEntry.objects.get(action="admin.fail_refund", target_id=odd.pk)
    assert audit.actor == "user:fin-mismatch" and audit.reason == "PSP charged 1700" and audit.after["status"] == "failed"

    assert topup_recovery_run().get("refunded") == 1
    assert topup_recovery_run().get("refunded", 0) == 0
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(charge.psp_reference, 1700)]
    assert b"act/fail_refund/" not in finance.get(f"/admin/payments/topup/{quote(odd.pk)}/change/").content


def test_a_legacy_row_without_the_charged_amount_refunds_what_the_psp_charged(quiet: Simulator) -> None:
    """A failed top-up recorded before the charged amount was kept (NULL), by the old branch
    that recorded a late charge without checking its amount: the refund used to send the
    top-up's own amount. It asks the PSP what the charge was and refunds that."""
    from payments.services.refunds import topup_refunds_run

    psp_key = psp_account_configure(quiet)
    owed = _owed_refund(quiet, psp_key, _frozen_customer(f"Legacy {uuid.uuid4().hex[:6]}"), 900)
    TopUp.objects.filter(pk=owed.pk).update(amount=1000, psp_charged_amount=None, psp_charged_currency="")
    assert topup_refunds_run()["refunded"] == 1
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(owed.psp_reference, 900)]


def test_a_recovery_pass_asks_about_each_orphan_once_however_slow_the_psp(quiet: Simulator, settings: Any, monkeypatch: Any) -> None:
    """Orphans whose lease expired, more than a page of them, and a PSP that times out: the
    pass takes each over once. The records it took over get a new lease that runs out while
    the pass is still at the PSP; they must not come round again on a later page (a pass
    that did so ran for as long as the PSP stayed slow, and the refunds never ran)."""
    from idempotency.canonical import fingerprint_compute
    from idempotency.engine import IdempotentCall
    from idempotency.entry import Claim, _claim_external
    from idempotency.selectors import IdempotencyPolicy
    from payments.services import topup_saga, topups
    from payments.services.topups import topup_pending_ensure

    settings.TALLY_TOPUP_LEASE_SECONDS = 1
    settings.TALLY_PSP_TIMEOUT_SECONDS = 0.6
    psp_account_configure(quiet)
    customer = customer_create(name=f"Slow PSP {uuid.uuid4().hex[:6]}")
    for _ in range(3):
        idem = uuid.uuid4().hex
        raw = json.dumps({"asset": "JPY", "amount": 500, "payment_method": "pm_card_visa"}).encode()
        call = IdempotentCall(
            principal_id=customer.pk, key=idem, scope="customer", request_id="req_slow", method="POST", path="/v1/customer/topups",
            fingerprint=fingerprint_compute(method="POST", path="/v1/customer/topups", principal_id=customer.pk, body=raw),
        )

        def on_claim(ctx: Any, idem: str = idem) -> None:
            topup_pending_ensure(topup_id=ctx.minted[topup_saga.MINT_NAME], customer=customer, asset_code="JPY", amount=500,
                                 payment_method="pm_card_visa", claim_principal_id=ctx.principal_id, claim_key=idem)

        assert isinstance(_claim_external(call=call, policy=IdempotencyPolicy(lease_seconds=1), mint={"topup": "top"}, on_claim=on_claim), Claim)
    time.sleep(1.2)
    quiet.faults(latency_ms=900)  # every charge times out: the outcome stays unknown

    class Looping(BaseException):  # not an Exception: the pass's isolation does not catch it
        pass

    asked: list[str] = []
    real_charge = topups.topup_charge

    def counted_charge(*, topup: TopUp) -> Any:
        asked.append(topup.pk)
        if len(asked) > 6:
            raise Looping(asked)
        return real_charge(topup=topup)

    monkeypatch.setattr(topups, "topup_charge", counted_charge)
    counts = topup_saga.topup_recovery_run(batch_size=2)
    assert counts.get("unavailable") == 3, counts
    assert len(asked) == len(set(asked)) == 3, asked


# --- What the PSP charged: recorded, matched, and what a refund gives back -----------------------


def _owed_refund(quiet: Simulator, psp_key: str, frozen: Any, amount: int) -> TopUp:
    """A top-up the PSP charged whose credit was refused (a frozen wallet): a card refund owed."""
    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway
    from payments.services.topups import topup_settle

    topup = TopUp.objects.create(customer=frozen, asset_id="JPY", amount=amount, payment_method="pm_card_visa", gateway="simulator")
    result = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0).charge(
        ChargeRequest(amount=amount, currency="JPY", payment_method="pm_card_visa", idempotency_key=topup.pk, reference=topup.pk)
    )
    with transaction.atomic():
        settled, refusal = topup_settle(topup_id=topup.pk, result=result)
    assert settled.status == "failed" and refusal is not None and settled.psp_charged
    return settled


def test_a_card_refund_gives_back_what_the_psp_charged(quiet: Simulator) -> None:
    """The charge's amount and currency are kept when it is recorded, and the refund sends
    that back, not the top-up's own amount (here edited after the charge, as a bug or a
    hand might): the PSP refuses a refund above its charge, and the card would wait for ever.
    The refund used to send `topup.amount`."""
    from payments.services.refunds import topup_refunds_run

    psp_key = psp_account_configure(quiet)
    owed = _owed_refund(quiet, psp_key, _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}"), 900)
    assert (owed.psp_charged_amount, owed.psp_charged_currency) == (900, "JPY")
    TopUp.objects.filter(pk=owed.pk).update(amount=1000)
    assert topup_refunds_run()["refunded"] == 1
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(owed.psp_reference, 900)]


def test_a_recovery_read_of_a_charge_of_another_amount_credits_nothing_and_queues_it(quiet: Simulator, monkeypatch: Any) -> None:
    """The PSP answers the recovery's question with a successful charge of another amount
    under the top-up's key: never credited, the top-up in the operator queue with the PSP's
    figures. It used to fail in the completion, counted as an error on every pass, asking
    the PSP again each time and never reaching a person."""
    from dataclasses import replace

    from django.utils import timezone

    from payments.services import topups
    from payments.services.topup_saga import topup_recovery_run

    psp_account_configure(quiet)
    customer = customer_create(name=f"Odd charge {uuid.uuid4().hex[:6]}")
    topup = _pending(customer, created=timezone.now() - timedelta(minutes=5), amount=500)[0]
    real_charge = topups.topup_charge
    monkeypatch.setattr(topups, "topup_charge", lambda *, topup: replace(real_charge(topup=topup), amount=5_000))

    counts = topup_recovery_run()

    assert counts.get("operator_review") == 1 and "error" not in counts, counts
    topup.refresh_from_db()
    assert topup.status == "pending" and topup.operator_review_at is not None and "5000 JPY" in topup.last_error
    assert not topup.psp_charged and _balance(customer) == 0 and LedgerTransaction.objects.filter(reference=topup.pk).count() == 0
    assert "operator_review" not in topup_recovery_run()  # queued: no longer asked about


# --- Recovery within the task's time: refunds every pass, the soft limit never swallowed ---------


@pytest.mark.parametrize("where", ["resolve", "refund"])
def test_a_soft_time_limit_inside_one_record_ends_the_pass(quiet: Simulator, monkeypatch: Any, where: str) -> None:
    """Celery's SoftTimeLimitExceeded is an Exception: the per-record isolation used to
    swallow it as one record's error, and the pass went on until the hard limit killed it
    (before its refunds and its settle). It must end the pass, so the task unwinds."""
    from celery.exceptions import SoftTimeLimitExceeded
    from django.utils import timezone

    from payments.services import refunds, topups
    from payments.services.topup_saga import topup_recovery_run

    psp_key = psp_account_configure(quiet)
    customer = customer_create(name=f"Soft {uuid.uuid4().hex[:6]}")
    if where == "resolve":
        _pending(customer, created=timezone.now() - timedelta(minutes=5))

        def out_of_time(*, topup: TopUp) -> Any:
            raise SoftTimeLimitExceeded()

        monkeypatch.setattr(topups, "topup_charge", out_of_time)
    else:
        _owed_refund(quiet, psp_key, _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}"), 300)

        def build_out_of_time(**kwargs: Any) -> Any:
            raise SoftTimeLimitExceeded()

        monkeypatch.setattr(refunds, "gateway_build", build_out_of_time)
    with pytest.raises(SoftTimeLimitExceeded):
        topup_recovery_run()


def _charged_uncredited(customer: Any, *, gateway: str, amount: int = 300) -> TopUp:
    """A failed top-up with a recorded charge at `gateway`: a card refund owed."""
    return TopUp.objects.create(
        customer=customer, asset_id="JPY", amount=amount, payment_method="pm_card_visa", gateway=gateway, status="failed",
        failure_code="cap_exceeded", psp_reference=f"pi_{uuid.uuid4().hex[:20]}", psp_charged=True, psp_charged_amount=amount,
        psp_charged_currency="JPY",
    )


@pytest.mark.parametrize("gateway", ["stripe", "simulator"])
def test_a_soft_time_limit_inside_the_psps_http_client_ends_the_pass(quiet: Simulator, monkeypatch: Any, gateway: str) -> None:
    """The soft limit strikes inside the HTTP call of a refund. stripe-python's
    RequestsClient wraps every transport exception (`except Exception`) in an
    APIConnectionError: the gateway took it for "Stripe did not answer", the refund was
    counted unavailable and the pass went on. It must end the pass; the simulator's
    urllib path likewise."""
    import http.client

    import requests
    from celery.exceptions import SoftTimeLimitExceeded

    from payments.services.topup_saga import topup_recovery_run
    from payments.services.topups import gateway_account_set

    if gateway == "stripe":
        gateway_account_set(gateway="stripe", api_base="http://127.0.0.1:9", secret_key="sk_test_x", webhook_secrets=["whsec_x"], active=False)
    else:
        psp_account_configure(quiet)
    _charged_uncredited(customer_create(name=f"Soft HTTP {uuid.uuid4().hex[:6]}"), gateway=gateway)

    def out_of_time(*args: Any, **kwargs: Any) -> Any:
        raise SoftTimeLimitExceeded()

    with monkeypatch.context() as patched:  # undone before the fixtures' teardown, which calls the simulator too
        if gateway == "stripe":
            patched.setattr(requests.Session, "request", out_of_time)
        else:
            patched.setattr(http.client.HTTPConnection, "request", out_of_time)
        with pytest.raises(SoftTimeLimitExceeded):
            topup_recovery_run()


def test_each_loop_budget_ends_at_the_passs_deadline(quiet: Simulator, settings: Any) -> None:
    """Loops that each keep their own budget could add up past the soft limit: a loop's
    budget is the smaller of its own and the time left in the pass. With no time left in
    the pass, a refund owed waits for the next pass however long the loop's own budget."""
    from django.core.cache import cache

    from payments.services.topup_saga import topup_recovery_run

    psp_key = psp_account_configure(quiet)
    owed = _owed_refund(quiet, psp_key, _frozen_customer(f"Deadline {uuid.uuid4().hex[:6]}"), 400)
    settings.TALLY_TOPUP_RECOVERY_LOOP_SECONDS = 60.0
    settings.TALLY_TOPUP_RECOVERY_PASS_SECONDS = 0.0
    try:
        counts = topup_recovery_run()
        assert counts.get("refunded", 0) == 0 and counts.get("budget_exhausted", 0) >= 1, counts
        settings.TALLY_TOPUP_RECOVERY_PASS_SECONDS = 60.0
        assert topup_recovery_run().get("refunded") == 1
    finally:
        cache.delete_many([f"topups:recovery:resume:{loop}" for loop in ("refunds", "pending")])
    owed.refresh_from_db()
    assert owed.psp_refund_reference


@pytest.mark.parametrize("loop_seconds", ["", "1"])
def test_a_soft_limit_too_short_for_a_recovery_pass_is_refused_at_start(loop_seconds: str) -> None:
    """A recovery soft limit of 45 s and a 10 s PSP timeout leave no loop budget: unset, the
    budget was rounded up to 1 s (a pass of 48 s, killed at 45 before its settle). Both ways
    it is now ImproperlyConfigured; the defaults start, and so does a short global soft limit
    (the failover test's 3 s for the relay): the recovery task has limits of its own."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT": "45", "TALLY_PSP_TIMEOUT_SECONDS": "10"}
    env.pop("TALLY_TOPUP_RECOVERY_LOOP_SECONDS", None)
    if loop_seconds:
        env["TALLY_TOPUP_RECOVERY_LOOP_SECONDS"] = loop_seconds
    short = subprocess.run([sys.executable, "-c", "import config.settings.base"], env=env, capture_output=True, text=True, timeout=60)
    assert short.returncode != 0 and "ImproperlyConfigured" in short.stderr, short.stderr[-2000:]
    env.pop("TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT")
    env.pop("TALLY_TOPUP_RECOVERY_LOOP_SECONDS", None)
    env.update(CELERY_TASK_SOFT_TIME_LIMIT="3", CELERY_TASK_TIME_LIMIT="20")
    ok = subprocess.run(
        [sys.executable, "-c", "import config.settings.base as s; print(s.CELERY_TASK_ANNOTATIONS['payments.topups_recover_tenant'])"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.strip() == "{'soft_time_limit': 120, 'time_limit': 180}"


class _HardKilled(BaseException):
    """The task's hard time limit: the process is gone, nothing after it runs."""


@contextmanager
def _celery_time_limits(*, soft: float, hard: float) -> Iterator[None]:
    """Celery's time limits on this thread, as the worker applies them: SoftTimeLimitExceeded
    raised into the running task at `soft` seconds, then (standing in for the kill) a
    BaseException at `hard`. Cancelled on leaving."""
    import ctypes

    from celery.exceptions import SoftTimeLimitExceeded

    target = threading.get_ident()
    done = threading.Event()

    def strike() -> None:
        for at, exc in ((soft, SoftTimeLimitExceeded), (hard - soft, _HardKilled)):
            if done.wait(at):
                return
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(exc))

    watchdog = threading.Thread(target=strike, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


def test_refunds_are_made_every_pass_while_the_psp_takes_10_s_to_answer_charges(quiet: Simulator, settings: Any) -> None:
    """A backlog of pending top-ups and a PSP that takes 10 s to answer a charge (each ask
    times out): every pass still makes the card refund owed, within the task's time limits
    (8 s soft, 10 s hard here; each loop's budget 0.5 s). The pass used to ask about every
    pending top-up before any refund, and was killed first. Work left over keeps the
    tenant due, and the next pass goes on from where the last one stopped."""
    from django.core.cache import cache
    from django.utils import timezone

    from payments.services.topup_saga import topup_recovery_run

    settings.TALLY_TOPUP_RECOVERY_LOOP_SECONDS = 0.5
    psp_key = psp_account_configure(quiet)
    customer, frozen = customer_create(name=f"Backlog {uuid.uuid4().hex[:6]}"), _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}")
    backlog = _pending(customer, created=timezone.now() - timedelta(minutes=10), n=12)
    asked: list[set[str]] = []
    try:
        for turn in range(2):
            quiet.faults(charge_latency_ms=0)
            owed = _owed_refund(quiet, psp_key, frozen, 300 + turn)  # a credit refused since the last pass
            quiet.faults(charge_latency_ms=10_000)
            DueWork.objects.filter(tenant_id=connection.schema_name).delete()
            started = time.monotonic()
            with _celery_time_limits(soft=8.0, hard=10.0):
                counts = topup_recovery_run()
            assert time.monotonic() - started < 8.0, counts
            owed.refresh_from_db()
            assert owed.psp_refund_reference and counts["refunded"] == 1, counts
            assert counts.get("budget_exhausted") and counts.get("unavailable", 0) >= 1, counts
            assert _topups_due(by=timezone.now()), "work left over must keep the tenant due"
            asked.append({t.pk for t in TopUp.objects.filter(pk__in=[b.pk for b in backlog]).exclude(last_error="")})
        refunds = quiet.state()["accounts"][psp_key]["refunds"]
        assert sorted(rf["amount"] for rf in refunds) == [300, 301]
        assert asked[1] > asked[0], asked  # the second pass asked about top-ups the first did not reach
    finally:
        quiet.faults(charge_latency_ms=0)
        cache.delete_many([f"topups:recovery:resume:{loop}" for loop in ("refunds", "pending")])


# --- A switched-off tenant keeps card money safe ------------------------------------------------


def _simulator_topup(customer: Any, amount: int) -> TopUp:
    return TopUp.objects.create(customer=customer, asset_id="JPY", amount=amount, payment_method="pm_card_visa", gateway="simulator")


def _charged_by_webhook(quiet: Simulator, psp_key: str, topup: TopUp, *, secret: str = "whsec_test_1") -> TopUp:
    """A pending simulator top-up charged at the simulator, whose charge.succeeded event is
    delivered signed through the PSP webhook endpoint (the tenant's host)."""
    from payments.gateways.base import ChargeRequest
    from payments.gateways.signing import signature_compute
    from payments.gateways.simulator import SimulatorGateway

    amount = topup.amount
    charge = SimulatorGateway(api_base=quiet.url, secret_key=psp_key, timeout=5.0).charge(
        ChargeRequest(amount=amount, currency="JPY", payment_method="pm_card_visa", idempotency_key=topup.pk, reference=topup.pk)
    )
    body = json.dumps({
        "id": f"evt_{uuid.uuid4().hex[:16]}", "object": "event", "type": "charge.succeeded", "created": int(time.time()),
        "data": {"object": {"id": charge.psp_reference, "object": "charge", "amount": amount, "currency": "jpy", "status": "succeeded",
                            "failure_code": "", "metadata": {"tally_topup": topup.pk}, "created": int(time.time())}},
    }).encode()
    ts = int(time.time())
    response = Client(HTTP_HOST=RECOVERY_TENANT["domain"]).post(
        "/v1/psp/webhooks/simulator", data=body, content_type="application/json",
        HTTP_PSP_SIGNATURE=f"t={ts},v1={signature_compute(secret=secret, body=body, timestamp=ts)}",
    )
    assert response.status_code == 200 and response.json()["outcome"] == "applied", response.content
    connection.set_tenant(Tenant.objects.get(schema_name=RECOVERY_TENANT["schema_name"]))
    topup.refresh_from_db()
    return topup


def test_a_switched_off_tenants_refused_credit_is_refunded_by_beat(quiet: Simulator) -> None:
    """The operator is switched off; a PSP webhook (still served: a real signed event
    through the endpoint) brings a charge whose credit is refused (the wallet frozen).
    Beat's 10 s task still visits the tenant and refunds the card; its safety sweep too.
    Both used to select active tenants only: charged, never credited, never refunded, and
    nobody could settle it."""
    from django.utils import timezone

    tenant = Tenant.objects.get(schema_name=RECOVERY_TENANT["schema_name"])
    psp_key = psp_account_configure(quiet)
    Tenant.objects.filter(pk=tenant.pk).update(is_active=False)  # rolled back with the test
    first = _charged_by_webhook(quiet, psp_key, _simulator_topup(_frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}"), 700))
    assert first.status == "failed" and first.failure_code == "wallet_frozen" and first.psp_charged
    assert _topups_due(by=timezone.now())
    topups_recover_due_tenants.apply()
    connection.set_tenant(tenant)
    first.refresh_from_db()
    assert first.psp_refund_reference, "beat's due task skipped the switched-off tenant"
    second = _owed_refund(quiet, psp_key, _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}"), 800)
    DueWork.objects.filter(tenant_id=tenant.schema_name).delete()  # a lost due row: the sweep's work
    topups_recover_all_tenants.apply()
    connection.set_tenant(tenant)
    second.refresh_from_db()
    assert second.psp_refund_reference, "the safety sweep skipped the switched-off tenant"
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert sorted(rf["amount"] for rf in refunds) == [700, 800]


def test_a_top_up_of_the_gateway_switched_away_from_is_settled_and_refunded_by_that_gateway(quiet: Simulator) -> None:
    """A top-up created under the simulator; the tenant then makes Stripe its active
    gateway. The simulator's webhook for that top-up still applies (the top-up's gateway
    signs for it, not the active one), and the card refund owed on it is made at the
    simulator, never at Stripe."""
    from payments.services.refunds import topup_refunds_run
    from payments.services.topups import gateway_account_set

    psp_key = psp_account_configure(quiet)
    frozen = _frozen_customer(f"Switch {uuid.uuid4().hex[:6]}")
    topup = _simulator_topup(frozen, 650)  # created while the simulator is the active gateway
    gateway_account_set(gateway="stripe", api_base="http://127.0.0.1:9", secret_key="sk_test_x", webhook_secrets=["whsec_x"], active=True)
    charged = _charged_by_webhook(quiet, psp_key, topup)
    assert charged.gateway == "simulator" and charged.status == "failed" and charged.psp_charged
    counts = topup_refunds_run()
    assert counts["refunded"] == 1 and counts["refund_unavailable"] == 0, counts
    charged.refresh_from_db()
    assert charged.psp_refund_reference
    refunds = quiet.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(charged.psp_reference, 650)]


def test_the_platform_admin_lists_a_switched_off_tenants_top_up_queue(quiet: Simulator) -> None:
    """A switched-off tenant's own admin answers 404, so the platform admin shows its card
    money still in flight on the tenant's page: pending top-ups (the operator queue among
    them) and card refunds owed, counted and listed. It showed nothing of them."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    tenant = Tenant.objects.get(schema_name=RECOVERY_TENANT["schema_name"])
    psp_key = psp_account_configure(quiet)
    customer = customer_create(name=f"Queue {uuid.uuid4().hex[:6]}")
    waiting = _pending(customer, created=timezone.now() - timedelta(hours=1), amount=1234)[0]
    queued = _pending(customer, created=timezone.now() - timedelta(hours=21), amount=4321)[0]
    TopUp.objects.filter(pk=queued.pk).update(operator_review_at=timezone.now())
    owed = _owed_refund(quiet, psp_key, _frozen_customer(f"Frozen {uuid.uuid4().hex[:6]}"), 555)
    Tenant.objects.filter(pk=tenant.pk).update(is_active=False)

    connection.set_schema_to_public()
    get_user_model().objects.create_superuser(username=f"platform-{uuid.uuid4().hex[:6]}", password="pw-123456")
    platform = Client(HTTP_HOST="public.test.localhost")
    assert platform.login(username=get_user_model().objects.latest("id").username, password="pw-123456")
    page = platform.get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "2 pending (1 waiting for an operator), 1 card refunds owed" in html, html[html.find("Money still"):][:3000]
    for topup in (waiting, queued, owed):
        assert topup.pk in html
    assert "refund owed (wallet_frozen)" in html and "operator queue since" in html and owed.psp_reference in html
    connection.set_tenant(tenant)


@pytest.mark.parametrize("case", ["schema_missing", "schema_not_migrated"])
def test_the_platform_tenant_page_survives_a_tenant_schema_it_cannot_read(quiet: Simulator, case: str) -> None:
    """A tenant whose schema is missing, or there but not migrated: reading its panels
    raised ProgrammingError and the platform tenant page answered 500. Each panel runs in
    a savepoint and shows "unavailable"; the rest of the page renders."""
    from django.contrib.auth import get_user_model

    schema = f"test_unreadable_{uuid.uuid4().hex[:8]}"
    connection.set_schema_to_public()
    Tenant.objects.bulk_create([Tenant(schema_name=schema, name="Unreadable", main_currency="JPY")])  # no schema created
    if case == "schema_not_migrated":
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE SCHEMA "{schema}"')  # rolled back with the test
    tenant = Tenant.objects.get(schema_name=schema)
    username = f"platform-{uuid.uuid4().hex[:6]}"
    get_user_model().objects.create_superuser(username=username, password="pw-123456")
    platform = Client(HTTP_HOST="public.test.localhost")
    assert platform.login(username=username, password="pw-123456")
    page = platform.get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "unavailable: the tenant&#x27;s schema could not be read" in html and "Unreadable" in html

