"""Admin face through HTTP: parties, API keys (shown once, rotation, revocation)."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import Api, World, error_of
from wallets.models import ApiKey, Customer


def test_create_and_list_customers(api: Api, world: World) -> None:
    r = api.post("/v1/admin/customers", world.staff.key, {"name": "Carol", "email": "carol@example.com"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["id"].startswith("cus_") and body["object"] == "customer" and body["name"] == "Carol"
    assert body["frozen"] is False and "created" in body
    assert Customer.objects.filter(pk=body["id"]).exists()
    r = api.get(f"/v1/admin/customers/{body['id']}", world.staff.key)
    assert r.status_code == 200 and r.json()["email"] == "carol@example.com"
    r = api.get("/v1/admin/customers", world.staff.key, {"limit": 2})
    page = r.json()
    assert page["object"] == "list" and len(page["data"]) == 2 and page["next_cursor"]
    assert page["data"][0]["id"] == body["id"]  # newest first


def test_merchant_store_terminal_chain(api: Api, world: World) -> None:
    m = api.post("/v1/admin/merchants", world.staff.key, {"name": "Deli"}).json()
    st = api.post("/v1/admin/stores", world.staff.key, {"merchant": m["id"], "name": "Corner"})
    assert st.status_code == 201 and st.json()["merchant"] == m["id"]
    te = api.post("/v1/admin/terminals", world.staff.key, {"store": st.json()["id"], "name": "T"})
    assert te.status_code == 201
    assert te.json()["merchant"] == m["id"] and te.json()["store"] == st.json()["id"]
    assert api.get(f"/v1/admin/merchants/{m['id']}", world.staff.key).json()["name"] == "Deli"
    assert api.get(f"/v1/admin/stores/{st.json()['id']}", world.staff.key).status_code == 200
    assert api.get(f"/v1/admin/terminals/{te.json()['id']}", world.staff.key).status_code == 200
    assert api.get("/v1/admin/merchants", world.staff.key).json()["data"][0]["id"] == m["id"]
    assert api.get("/v1/admin/stores", world.staff.key).status_code == 200
    assert api.get("/v1/admin/terminals", world.staff.key).status_code == 200


def test_store_for_unknown_merchant_is_404_with_param(api: Api, world: World) -> None:
    r = api.post("/v1/admin/stores", world.staff.key, {"merchant": "mer_doesnotexist", "name": "X"})
    assert r.status_code == 404
    assert error_of(r)["param"] == "merchant"


@pytest.mark.parametrize("ptype", ["customer", "merchant", "terminal", "staff"])
def test_api_key_create_is_shown_once_and_works(api: Api, world: World, ptype: str) -> None:
    pid = {"customer": world.customer2.id, "merchant": world.merchant2.id, "terminal": world.terminal2.id, "staff": world.staff.id}[ptype]
    r = api.post("/v1/admin/api_keys", world.staff.key, {"principal_type": ptype, "principal_id": pid})
    assert r.status_code == 201, r.content
    body = r.json()
    prefix = {"customer": "ck_", "merchant": "sk_", "terminal": "tk_", "staff": "ak_"}[ptype]
    assert body["key"].startswith(prefix) and body["key"].startswith(body["prefix"])
    assert body["principal_id"] == pid and body["object"] == "api_key"
    row = ApiKey.objects.get(pk=body["id"])
    assert body["key"] not in json.dumps(list(ApiKey.objects.filter(pk=row.pk).values()), default=str)
    listed = api.get(f"/v1/admin/api_keys/{body['id']}", world.staff.key)
    assert listed.status_code == 200 and "key" not in listed.json()
    face = {"customer": "/v1/customer/wallet", "merchant": "/v1/merchant/balance", "terminal": "/v1/terminal/payments",
            "staff": "/v1/admin/customers"}[ptype]
    if ptype != "terminal":
        assert api.get(face, body["key"]).status_code == 200


def test_api_key_rotation_overlap_then_revoke(api: Api, world: World) -> None:
    old = ApiKey.objects.get(customer=world.merchant.obj) if False else ApiKey.objects.get(merchant=world.merchant.obj)
    r = api.post(f"/v1/admin/api_keys/{old.id}/rotate", world.staff.key, {"overlap_seconds": 3600})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["key"].startswith("sk_") and body["replaces"]["id"] == old.id and body["replaces"]["expires_at"]
    # both work during the overlap
    assert api.get("/v1/merchant/balance", world.merchant.key).status_code == 200
    assert api.get("/v1/merchant/balance", body["key"]).status_code == 200
    # zero overlap: the old one stops at once
    r2 = api.post(f"/v1/admin/api_keys/{body['id']}/rotate", world.staff.key, {"overlap_seconds": 0})
    assert r2.status_code == 201
    assert api.get("/v1/merchant/balance", body["key"]).status_code == 401
    r3 = api.post(f"/v1/admin/api_keys/{r2.json()['id']}/revoke", world.staff.key, {})
    assert r3.status_code == 200 and r3.json()["revoked_at"]
    denied = api.get("/v1/merchant/balance", r2.json()["key"])
    assert denied.status_code == 401 and error_of(denied)["code"] == "api_key_invalid"
    keys = api.get("/v1/admin/api_keys", world.staff.key, {"principal_id": world.merchant.id}).json()["data"]
    assert {k["id"] for k in keys} == {old.id, body["id"], r2.json()["id"]}


def test_api_key_for_unknown_principal_is_404(api: Api, world: World) -> None:
    r = api.post("/v1/admin/api_keys", world.staff.key, {"principal_type": "customer", "principal_id": "cus_nope"})
    assert r.status_code == 404 and error_of(r)["param"] == "principal_id"
    r = api.post("/v1/admin/api_keys", world.staff.key, {"principal_type": "customer", "principal_id": world.merchant.id})
    assert r.status_code == 404


def test_last_used_at_is_recorded(api: Api, world: World) -> None:
    key = ApiKey.objects.get(staff=world.staff.obj)
    assert key.last_used_at is None
    api.get("/v1/admin/customers", world.staff.key)
    key.refresh_from_db()
    assert key.last_used_at is not None


@pytest.mark.parametrize(
    ("path", "secret_field"),
    [("/v1/admin/api_keys", "key"), ("/v1/customer/payment_tokens", "token"), ("/v1/merchant/webhook_endpoints", "secret")],
)
def test_secrets_shown_once_are_sealed_at_rest_and_replayed_byte_identical(api: Api, world: World, path: str, secret_field: str) -> None:
    from django.db import connection as db

    from idempotency.models import IdempotencyRecord

    bodies = {
        "/v1/admin/api_keys": (world.staff.key, {"principal_type": "customer", "principal_id": world.customer2.id}),
        "/v1/customer/payment_tokens": (world.customer.key, {}),
        "/v1/merchant/webhook_endpoints": (world.merchant.key, {"url": "https://93.184.215.14/tally", "enabled_events": ["payment.succeeded"]}),
    }
    bearer, body = bodies[path]
    first = api.post(path, bearer, body, idem="sealed-secret-1")
    assert first.status_code == 201, first.content
    secret = first.json()[secret_field]
    assert secret
    record = IdempotencyRecord.objects.get(key="sealed-secret-1")
    assert secret.encode() not in bytes(record.response_body)
    with db.cursor() as cursor:  # nowhere in the row, whatever the column
        cursor.execute("SELECT row_to_json(r)::text FROM idempotency_record r WHERE key = %s", ["sealed-secret-1"])
        assert secret not in cursor.fetchone()[0]
    replay = api.post(path, bearer, body, idem="sealed-secret-1")
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content


def test_a_revoked_key_cannot_be_rotated_into_a_working_one(api: Api, world: World) -> None:
    created = api.post("/v1/admin/api_keys", world.staff.key, {"principal_type": "customer", "principal_id": world.customer2.id}).json()
    assert api.post(f"/v1/admin/api_keys/{created['id']}/revoke", world.staff.key, {}).status_code == 200
    r = api.post(f"/v1/admin/api_keys/{created['id']}/rotate", world.staff.key, {"overlap_seconds": 60})
    assert r.status_code == 409, r.content
    assert r.json()["error"]["code"] == "invalid_state"
    assert api.get("/v1/customer/wallet", created["key"]).status_code == 401
