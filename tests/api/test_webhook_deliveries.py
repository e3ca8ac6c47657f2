"""Merchant webhook deliveries through HTTP (list, redeliver, the reason an endpoint was
disabled), SSRF refusals at registration, the staff admin's actions, and the `make run`
demo: the copyable receiver as a real process, getting a real payment's event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote  # admin URLs escape ids (`_` is the escape)
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from devtools.demo_seed import demo_webhook_endpoint_ensure
from payments.models import OutboxEvent
from payments.services.adjustments import adjustment_create
from tenants.models import Tenant
from tests.api.conftest import Api, World, error_of
from tests.receivers import free_port, receiver_running
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.secrets import webhook_endpoint_secrets
from webhooks.services.deliveries import RETRY_WINDOW
from webhooks.services.relay import outbox_relay_run

ROOT = Path(__file__).resolve().parent.parent.parent


def _pay(api: Api, world: World, amount: int = 500) -> dict[str, Any]:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": amount})
    assert r.status_code == 201, r.content
    return r.json()  # type: ignore[no-any-return]


def _register(api: Api, world: World, url: str) -> dict[str, Any]:
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": url, "enabled_events": ["payment.succeeded"]})
    assert r.status_code == 201, r.content
    return r.json()  # type: ignore[no-any-return]


def test_list_and_redeliver(api: Api, world: World, loopback_http: None) -> None:
    with receiver_running() as rx:
        hook = _register(api, world, rx.url())
        payment = _pay(api, world)
        outbox_relay_run()
        event = OutboxEvent.objects.get(topic="payment.succeeded", payload__id=payment["id"])
        listed = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}/deliveries", world.merchant.key)
        assert listed.status_code == 200, listed.content
        [delivery] = listed.json()["data"]
        assert delivery["object"] == "webhook_delivery" and delivery["id"].startswith("whd_")
        assert (delivery["event"], delivery["type"], delivery["status"], delivery["attempts"]) == (event.id, "payment.succeeded", "succeeded", 1)
        assert delivery["last_status_code"] == 200 and delivery["delivered_at"] and delivery["next_attempt_at"] is None
        r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}/redeliver", world.merchant.key, {"delivery": delivery["id"]})
        assert r.status_code == 200, r.content
        assert r.json()["status"] == "pending" and r.json()["next_attempt_at"]
        outbox_relay_run()
        assert rx.event_ids() == [event.id, event.id]  # the same event, the same id
    again = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}/deliveries", world.merchant.key).json()["data"][0]
    assert again["status"] == "succeeded" and again["attempts"] == 2


def test_deliveries_are_the_merchants_own(api: Api, world: World, loopback_http: None) -> None:
    with receiver_running() as rx:
        hook = _register(api, world, rx.url())
        _pay(api, world)
        outbox_relay_run()
    delivery_id = WebhookDelivery.objects.get(endpoint_id=hook["id"]).id
    other = api.post("/v1/merchant/webhook_endpoints", world.merchant2.key, {"url": "https://93.184.215.14/h", "enabled_events": ["*"]}).json()
    for method, path, body in [
        ("GET", f"/v1/merchant/webhook_endpoints/{hook['id']}/deliveries", None),
        ("POST", f"/v1/merchant/webhook_endpoints/{hook['id']}/redeliver", {"delivery": delivery_id}),
        ("POST", f"/v1/merchant/webhook_endpoints/{other['id']}/redeliver", {"delivery": delivery_id}),  # its endpoint, not this delivery's
    ]:
        r = api.call(method, path, world.merchant2.key, body)
        assert r.status_code == 404, (path, r.content)
        assert delivery_id not in r.content.decode()
    r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}/redeliver", world.merchant.key, {"delivery": "whd_nope"})
    assert r.status_code == 404 and error_of(r)["param"] == "delivery"
    r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}/redeliver", world.merchant.key, {})
    assert r.status_code == 400 and error_of(r)["param"] == "delivery"


def test_a_disabled_endpoint_says_why_and_redelivers_once_enabled(api: Api, world: World, loopback_http: None) -> None:
    port = free_port()
    hook = _register(api, world, f"http://127.0.0.1:{port}/hook")
    _pay(api, world)
    outbox_relay_run()
    outbox_relay_run(now=timezone.now() + RETRY_WINDOW + timedelta(minutes=1))
    body = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}", world.merchant.key).json()
    assert body["status"] == "disabled" and "failed for 3 days" in body["disabled_reason"] and "Connection" in body["disabled_reason"]
    [delivery] = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}/deliveries", world.merchant.key).json()["data"]
    assert delivery["status"] == "failed" and delivery["attempts"] == 2
    r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}/redeliver", world.merchant.key, {"delivery": delivery["id"]})
    assert r.status_code == 409 and error_of(r)["code"] == "webhook_delivery_not_redeliverable"
    r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}", world.merchant.key, {"status": "enabled"})
    assert r.status_code == 200 and r.json()["disabled_reason"] == ""
    r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}/redeliver", world.merchant.key, {"delivery": delivery["id"]})
    assert r.status_code == 200
    with receiver_running(port=port) as rx:
        outbox_relay_run()
    assert len(rx.requests) == 1
    assert WebhookDelivery.objects.get(pk=delivery["id"]).status == "succeeded"


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1/", "http://169.254.169.254/latest/meta-data/", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/",
     "http://10.0.0.1/", "http://192.168.0.10/", "http://localhost:6379/", "http://127.0.0.1:99999/", "https://[fe80::1]/"],
)
def test_registration_refuses_internal_targets_over_http(api: Api, world: World, settings: Any, url: str) -> None:
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": url, "enabled_events": ["*"]})
    assert r.status_code == 400, (url, r.content)
    assert error_of(r)["param"] == "url"
    assert not WebhookEndpoint.objects.exists()


def test_staff_redeliver_and_requeue_from_the_admin(api: Api, world: World, tenant: Tenant, loopback_http: None) -> None:
    get_user_model().objects.create_superuser(username="hooks-root", password="pw-123456")
    admin = Client(HTTP_HOST=world.host)
    assert admin.login(username="hooks-root", password="pw-123456")
    with receiver_running() as rx:
        hook = _register(api, world, rx.url())
        _pay(api, world)
        outbox_relay_run()
        delivery = WebhookDelivery.objects.get(endpoint_id=hook["id"])
        for page in ("webhookdelivery", "webhookendpoint", "outboxevent"):
            app = "payments" if page == "outboxevent" else "webhooks"
            r = admin.get(f"/admin/{app}/{page}/")
            assert r.status_code == 200, page
        page = admin.get(f"/admin/webhooks/webhookdelivery/{quote(delivery.pk)}/change/")
        assert page.status_code == 200 and b"ok" in page.content  # the attempt log's response excerpt
        assert hook["id"].encode() in admin.get("/admin/webhooks/webhookendpoint/").content
        secret = webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=hook["id"])).current.encode()
        assert secret not in admin.get(f"/admin/webhooks/webhookendpoint/{quote(hook['id'])}/change/").content
        # Staff actions: a confirmation page with its own idempotency key (payments/admin_actions.py).
        r = admin.post(f"/admin/webhooks/webhookdelivery/{quote(delivery.pk)}/act/redeliver/", {"idempotency_key": "k-redeliver-1"})
        assert r.status_code == 302
        assert WebhookDelivery.objects.get(pk=delivery.pk).status == "pending"
        outbox_relay_run()
        assert len(rx.requests) == 2
        r = admin.post(f"/admin/webhooks/webhookendpoint/{quote(hook['id'])}/act/disable/", {"idempotency_key": "k-disable-1"})
        assert r.status_code == 302 and WebhookEndpoint.objects.get(pk=hook["id"]).status == "disabled"
        # The endpoint's own cap on requests in flight (empty: the platform default).
        r = admin.post(
            f"/admin/webhooks/webhookendpoint/{quote(hook['id'])}/act/concurrency/", {"idempotency_key": "k-conc-1", "max_concurrency": "2"}
        )
        assert r.status_code == 302 and WebhookEndpoint.objects.get(pk=hook["id"]).max_concurrency == 2
    event = OutboxEvent.objects.get(pk=delivery.event_id)
    OutboxEvent.objects.filter(pk=event.pk).update(published_at=None, dead_at=timezone.now(), attempts=8)
    r = admin.post(f"/admin/payments/outboxevent/{quote(event.pk)}/act/requeue/", {"idempotency_key": "k-requeue-1"})
    assert r.status_code == 302
    event.refresh_from_db()
    assert event.dead_at is None and event.attempts == 0


def test_make_run_demo_receiver_process_gets_a_payment_once(api: Api, world: World, tenant: Tenant, loopback_http: None, tmp_path: Path) -> None:
    """What `make run` wires: the demo merchant's endpoint (devtools.demo_seed) and the Procfile's
    receiver (devtools/webhook_receiver.py, run as its own process)."""
    port = free_port()
    state = demo_webhook_endpoint_ensure(
        merchant_id=world.merchant.id, url=f"http://127.0.0.1:{port}/webhooks", state_file=tmp_path / "hook.json", schema=tenant.schema_name
    )
    assert json.loads((tmp_path / "hook.json").read_text()) == state
    again = demo_webhook_endpoint_ensure(
        merchant_id=world.merchant.id, url=f"http://127.0.0.1:{port}/webhooks", state_file=tmp_path / "hook.json", schema=tenant.schema_name
    )
    assert again == state  # a second `make run` reuses the endpoint and its secret
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "devtools" / "webhook_receiver.py"), "--port", str(port)],
        env={**os.environ, "TALLY_WEBHOOK_SECRET": state["secret"]}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not _listening(port):
            assert receiver.poll() is None and time.monotonic() < deadline, receiver.communicate()
            time.sleep(0.05)
        payment = _pay(api, world, amount=321)
        outbox_relay_run()
        delivery = WebhookDelivery.objects.get(endpoint_id=state["endpoint"])
        assert delivery.status == "succeeded", delivery.last_error
        api.post(f"/v1/merchant/webhook_endpoints/{state['endpoint']}/redeliver", world.merchant.key, {"delivery": delivery.id})
        outbox_relay_run()  # delivered twice...
        assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 2
    finally:
        receiver.terminate()
        out, _ = receiver.communicate(timeout=10)
    lines = [line for line in out.splitlines() if line.startswith("evt_")]
    assert len(lines) == 1 and f"payment.succeeded {payment['id']} 321 JPY" in lines[0]  # ...handled once


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _fill_endpoints(api: Api, world: World) -> list[str]:
    """The merchant registers endpoints up to its limit (as a schemathesis run did)."""
    from webhooks.services.endpoints import MAX_ENDPOINTS_PER_MERCHANT

    made = []
    while WebhookEndpoint.objects.filter(merchant_id=world.merchant.id).count() < MAX_ENDPOINTS_PER_MERCHANT:
        made.append(_register(api, world, f"https://93.184.215.14/h{len(made)}")["id"])
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": "https://93.184.215.14/one-more", "enabled_events": ["*"]})
    assert r.status_code == 409 and error_of(r)["code"] == "webhook_endpoint_limit_reached"
    return made


def test_make_run_seeds_its_endpoint_when_the_merchant_is_at_its_endpoint_limit(
    api: Api, world: World, tenant: Tenant, loopback_http: None, tmp_path: Path
) -> None:
    """No endpoint at the receiver's URL and no room for one: the seed repoints the oldest
    endpoint instead of stopping `make run`, and says so."""
    made = _fill_endpoints(api, world)
    url, said = f"http://127.0.0.1:{free_port()}/webhooks", []
    state = demo_webhook_endpoint_ensure(
        merchant_id=world.merchant.id, url=url, state_file=tmp_path / "hook.json", schema=tenant.schema_name, say=said.append
    )
    endpoint = WebhookEndpoint.objects.get(pk=state["endpoint"])
    assert (endpoint.pk, endpoint.url, endpoint.status, endpoint.enabled_events) == (made[0], url, "enabled", ["*"])
    assert webhook_endpoint_secrets(endpoint=endpoint).current == state["secret"]
    assert len(said) == 1 and made[0] in said[0] and url in said[0]
    assert WebhookEndpoint.objects.filter(merchant_id=world.merchant.id).count() == len(made)
    # The next run finds it at its URL: nothing to repair, the same secret.
    said.clear()
    again = demo_webhook_endpoint_ensure(
        merchant_id=world.merchant.id, url=url, state_file=tmp_path / "hook.json", schema=tenant.schema_name, say=said.append
    )
    assert again == state and said == []


def test_make_run_repoints_its_endpoint_after_an_api_client_changed_its_url(
    api: Api, world: World, tenant: Tenant, loopback_http: None, tmp_path: Path
) -> None:
    """The demo's endpoint repointed elsewhere and disabled through the API, and the rest of
    the merchant's endpoints filled: the seed takes its own endpoint back (same id)."""
    url = f"http://127.0.0.1:{free_port()}/webhooks"
    first = demo_webhook_endpoint_ensure(merchant_id=world.merchant.id, url=url, state_file=tmp_path / "hook.json", schema=tenant.schema_name)
    r = api.post(f"/v1/merchant/webhook_endpoints/{first['endpoint']}", world.merchant.key,
                 {"url": "https://93.184.215.14/elsewhere", "status": "disabled", "enabled_events": ["payment.refunded"]})
    assert r.status_code == 200, r.content
    _fill_endpoints(api, world)
    said: list[str] = []
    state = demo_webhook_endpoint_ensure(
        merchant_id=world.merchant.id, url=url, state_file=tmp_path / "hook.json", schema=tenant.schema_name, say=said.append
    )
    assert state == first  # its own endpoint, its secret unchanged
    endpoint = WebhookEndpoint.objects.get(pk=first["endpoint"])
    assert (endpoint.url, endpoint.status, endpoint.enabled_events) == (url, "enabled", ["*"])
    assert any("pointed at" in line for line in said) and any("enabled again" in line for line in said)


def test_a_refusal_at_send_time_reads_the_same_whatever_the_reason(api: Api, world: World, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merchant registers a public name, then re-points it (a CNAME) at an internal one:
    every send is refused. What the merchant reads (the delivery's `last_error`, the
    endpoint's `disabled_reason`) is one fixed text, so it cannot map our internal DNS;
    the reason is in the staff-only attempt log."""
    import socket

    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = False
    real_getaddrinfo = socket.getaddrinfo
    points_at = {"hooks.repointed.test": "93.184.215.14"}

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in points_at:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (points_at[host], port))]
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    hook = _register(api, world, "http://hooks.repointed.test/hook")
    points_at["hooks.repointed.test"] = "10.20.30.40"  # the merchant's DNS now names an internal host
    _pay(api, world)
    outbox_relay_run()
    [delivery] = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}/deliveries", world.merchant.key).json()["data"]
    assert delivery["status"] == "pending" and delivery["last_error"] == "refused: url not allowed"
    outbox_relay_run(now=timezone.now() + RETRY_WINDOW + timedelta(minutes=1))
    [delivery] = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}/deliveries", world.merchant.key).json()["data"]
    assert delivery["status"] == "failed" and delivery["last_error"] == "refused: url not allowed"
    body = api.get(f"/v1/merchant/webhook_endpoints/{hook['id']}", world.merchant.key).json()
    assert body["status"] == "disabled" and body["disabled_reason"].endswith(": refused: url not allowed"), body
    assert "private" not in json.dumps([delivery, body]) and "10.20.30.40" not in json.dumps([delivery, body])
    # Staff see why, in the attempt log (the admin only).
    errors = set(WebhookDelivery.objects.get(pk=delivery["id"]).attempt_log.values_list("error", flat=True))
    assert len(errors) == 1 and errors.pop().startswith("refused: url must reach a public address; hooks.repointed.test is a private"), errors


def test_make_run_rotates_a_secret_that_no_longer_opens_and_remakes_an_unreadable_state_file(
    api: Api, world: World, tenant: Tenant, loopback_http: None, tmp_path: Path
) -> None:
    """The sealing keys changed (var/sealing_keys deleted, TALLY_SEALING_KEYS changed), so
    the saved endpoint's secret does not open; or the state file is corrupt or not an
    object: the seed rotates the secret and says so, never stops `make run`."""
    url, state_file = f"http://127.0.0.1:{free_port()}/webhooks", tmp_path / "hook.json"
    first = demo_webhook_endpoint_ensure(merchant_id=world.merchant.id, url=url, state_file=state_file, schema=tenant.schema_name)
    other = _register(api, world, "https://93.184.215.14/other")
    # Sealed under another endpoint's binding: opens under no key of the ring (InvalidTag).
    WebhookEndpoint.objects.filter(pk=first["endpoint"]).update(
        secret_sealed=WebhookEndpoint.objects.get(pk=other["id"]).secret_sealed
    )
    said: list[str] = []
    state = demo_webhook_endpoint_ensure(
        merchant_id=world.merchant.id, url=url, state_file=state_file, schema=tenant.schema_name, say=said.append
    )
    assert state["endpoint"] == first["endpoint"] and state["secret"] != first["secret"]
    assert webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=state["endpoint"])).current == state["secret"]
    assert len(said) == 1 and "does not open" in said[0] and "InvalidTag" in said[0]
    for corrupt in ("{not json", "[1, 2]", "null", "\xff"):
        state_file.write_text(corrupt)
        said.clear()
        again = demo_webhook_endpoint_ensure(
            merchant_id=world.merchant.id, url=url, state_file=state_file, schema=tenant.schema_name, say=said.append
        )
        assert again["endpoint"] == first["endpoint"] and json.loads(state_file.read_text()) == again, corrupt
        assert webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=again["endpoint"])).current == again["secret"]
        assert len(said) == 1 and "unreadable" in said[0], (corrupt, said)
