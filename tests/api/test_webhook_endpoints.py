"""Merchant webhook endpoints: registration, the secret shown once, rotation, scoping."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from tests.api.conftest import Api, World, error_of
from webhooks.errors import WebhookUrlNotAllowed
from webhooks.models import WebhookEndpoint
from webhooks.services.endpoints import webhook_endpoint_signing_secrets


def _create(api: Api, world: World, **body: object) -> dict:  # type: ignore[type-arg]
    payload = {"url": "https://93.184.215.14/hooks", "enabled_events": ["payment.succeeded"], **body}
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, payload)
    assert r.status_code == 201, r.content
    return r.json()  # type: ignore[no-any-return]


def test_register_shows_secret_once(api: Api, world: World) -> None:
    body = _create(api, world, description="orders")
    assert body["id"].startswith("we_") and body["object"] == "webhook_endpoint"
    assert body["secret"].startswith("whsec_") and body["status"] == "enabled"
    r = api.get(f"/v1/merchant/webhook_endpoints/{body['id']}", world.merchant.key)
    assert r.status_code == 200 and "secret" not in r.json()
    listed = api.get("/v1/merchant/webhook_endpoints", world.merchant.key).json()
    assert [e["id"] for e in listed["data"]] == [body["id"]]
    assert "secret" not in listed["data"][0]


def test_rotation_keeps_old_secret_signing_during_overlap(api: Api, world: World) -> None:
    body = _create(api, world)
    r = api.post(f"/v1/merchant/webhook_endpoints/{body['id']}/rotate_secret", world.merchant.key, {"overlap_seconds": 600})
    assert r.status_code == 200, r.content
    new_secret = r.json()["secret"]
    assert new_secret != body["secret"]
    endpoint = WebhookEndpoint.objects.get(pk=body["id"])
    assert webhook_endpoint_signing_secrets(endpoint=endpoint) == [new_secret, body["secret"]]
    later = timezone.now() + timedelta(seconds=601)
    assert webhook_endpoint_signing_secrets(endpoint=endpoint, now=later) == [new_secret]


def test_the_stored_row_holds_neither_secret_after_register_and_rotate(api: Api, world: World) -> None:
    body = _create(api, world)
    r = api.post(f"/v1/merchant/webhook_endpoints/{body['id']}/rotate_secret", world.merchant.key, {"overlap_seconds": 600})
    assert r.status_code == 200, r.content
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM webhooks_webhookendpoint WHERE id = %s", [body["id"]])
        row = cursor.fetchone()
    assert row is not None
    raw = b"\x00".join(bytes(v) if isinstance(v, bytes | memoryview) else str(v).encode() for v in row)
    for secret in (body["secret"], r.json()["secret"]):
        assert secret.removeprefix("whsec_").encode() not in raw
    endpoint = WebhookEndpoint.objects.get(pk=body["id"])
    assert webhook_endpoint_signing_secrets(endpoint=endpoint) == [r.json()["secret"], body["secret"]]


def test_update_and_disable(api: Api, world: World) -> None:
    body = _create(api, world)
    r = api.post(f"/v1/merchant/webhook_endpoints/{body['id']}", world.merchant.key, {"status": "disabled", "enabled_events": ["*"]})
    assert r.status_code == 200 and r.json()["status"] == "disabled" and r.json()["enabled_events"] == ["*"]


def test_plain_http_and_bad_events_are_refused(api: Api, world: World) -> None:
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": "http://merchant.example/h", "enabled_events": ["*"]})
    assert r.status_code == 400 and error_of(r)["param"] == "url"
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": "https://m.example/h", "enabled_events": ["DROP TABLE"]})
    assert r.status_code == 400 and error_of(r)["param"] == "enabled_events.0"  # the item at fault
    assert not WebhookEndpoint.objects.exists()


def test_another_merchants_endpoint_is_404(api: Api, world: World) -> None:
    body = _create(api, world)
    for method, path in [("GET", f"/v1/merchant/webhook_endpoints/{body['id']}"),
                         ("POST", f"/v1/merchant/webhook_endpoints/{body['id']}"),
                         ("POST", f"/v1/merchant/webhook_endpoints/{body['id']}/rotate_secret")]:
        r = api.call(method, path, world.merchant2.key, {} if method == "POST" else None)
        assert r.status_code == 404, (path, r.content)
        assert body["secret"] not in r.content.decode()
    assert api.get("/v1/merchant/webhook_endpoints", world.merchant2.key).json()["data"] == []


def test_every_refused_url_gets_one_answer_whatever_the_reason(api: Api, world: World, settings: Any) -> None:
    """A private address, a name that resolves to loopback, one that does not resolve, a
    bad scheme, credentials, a bad port, not a URL: the same 400, code and message, on
    register and on update, so the answer says nothing about how our resolver sees a name."""
    settings.TALLY_WEBHOOK_ALLOW_HTTP = False
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = False
    refused = [
        "https://10.0.0.5/h", "https://169.254.169.254/latest/meta-data/", "https://localhost/h", "https://[::1]/h",
        "https://hooks.does-not-resolve.invalid/h", "http://93.184.215.14/h", "ftp://93.184.215.14/h",
        "https://user:pw@93.184.215.14/h", "https://93.184.215.14:0/h", "not a url",
    ]
    answers = set()
    for url in refused:
        r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": url, "enabled_events": ["*"]})
        assert r.status_code == 400, (url, r.content)
        answers.add((error_of(r)["code"], error_of(r)["message"], error_of(r)["param"]))
    assert not WebhookEndpoint.objects.exists()
    hook = _create(api, world)
    for url in refused:
        r = api.post(f"/v1/merchant/webhook_endpoints/{hook['id']}", world.merchant.key, {"url": url})
        assert r.status_code == 400, (url, r.content)
        answers.add((error_of(r)["code"], error_of(r)["message"], error_of(r)["param"]))
    assert answers == {("webhook_url_not_allowed", WebhookUrlNotAllowed.MESSAGE, "url")}
    assert WebhookEndpoint.objects.get(pk=hook["id"]).url == "https://93.184.215.14/hooks"
