"""Bad input of every kind on the money endpoints: a clear 4xx in the envelope, `param`
naming the field where there is one, and no rows changed. Plus the transport-level
errors (413, 415, 405, 404, malformed JSON) in the same envelope."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from payments.models import Adjustment, OutboxEvent, Payment, PaymentIntent, Refund, TopUp, Transfer
from payments.services.adjustments import adjustment_create
from tests.api.conftest import Api, World, error_of
from wallets.models import Balance, LedgerEntry


def _counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Payment, Refund, Transfer, TopUp, Adjustment, PaymentIntent, LedgerEntry, Balance, OutboxEvent))


BAD_AMOUNTS: list[tuple[Any, str]] = [
    (10.5, "fraction"),
    (10.0, "float with zero fraction"),
    (1e3, "exponent float"),
    ("100", "numeric string"),
    ("1e3", "string exponent"),
    ("ten", "word"),
    (True, "boolean"),
    (0, "zero"),
    (-5, "negative"),
    (None, "null"),
    ([100], "list"),
    ({"value": 100}, "object"),
    (10**16, "beyond the maximum"),
    (10**400, "huge number"),
]


def _money_endpoints(world: World, payment_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 100}),
        ("/v1/customer/transfers", world.customer.key, {"to_customer": world.customer2.id, "asset": "JPY", "amount": 100}),
        ("/v1/customer/topups", world.customer.key, {"asset": "JPY", "amount": 100, "payment_method": "pm_card_visa"}),
        ("/v1/merchant/refunds", world.merchant.key, {"payment": payment_id, "amount": 100}),
        ("/v1/terminal/refunds", world.terminal.key, {"payment": payment_id, "amount": 100}),
        ("/v1/merchant/payment_intents", world.merchant.key, {"customer": world.customer.id, "asset": "JPY", "amount": 100}),
        ("/v1/admin/adjustments", world.staff.key,
         {"customer": world.customer.id, "asset": "JPY", "amount": 100, "direction": "credit", "reason": "r"}),
    ]


@pytest.fixture
def funded(api: Api, world: World) -> str:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1000})
    assert r.status_code == 201
    return str(r.json()["id"])


def test_bad_amounts_are_400_with_param_and_change_nothing(api: Api, world: World, funded: str) -> None:
    before = _counts()
    for path, key, body in _money_endpoints(world, funded):
        for bad, label in BAD_AMOUNTS:
            raw = json.dumps({**body, "amount": bad}) if bad != 10**400 else json.dumps(body).replace('"amount": 100', '"amount": ' + "9" * 400)
            r = api.post(path, key, raw=raw)
            assert r.status_code == 400, (path, label, r.content)
            err = error_of(r)
            if bad != 10**400:  # a number Python refuses to parse fails as malformed JSON: no field yet
                assert err["param"] == "amount", (path, label, err)
    assert _counts() == before


def test_missing_fields_unknown_assets_and_unknown_fields(api: Api, world: World, funded: str) -> None:
    before = _counts()
    for path, key, body in _money_endpoints(world, funded):
        for field in body:
            r = api.post(path, key, {k: v for k, v in body.items() if k != field})
            if path == "/v1/admin/adjustments" and field == "customer":
                assert r.status_code == 400 and error_of(r)["param"] == "customer"
                continue
            assert r.status_code == 400, (path, field, r.content)
            assert error_of(r)["param"] == field or (field == "customer" and error_of(r)["param"] == "customer_token"), (path, field)
            assert error_of(r)["code"] in {"parameter_missing", "parameter_invalid"}
        if "asset" in body:
            for asset in ("XXX", "jpy", "", "J\x00PY", "A" * 500):
                r = api.post(path, key, {**body, "asset": asset})
                assert r.status_code == 400, (path, asset, r.content)
                assert error_of(r)["param"] == "asset"
        r = api.post(path, key, {**body, "amonut": 5})
        assert r.status_code == 400 and error_of(r)["param"] == "amonut" and error_of(r)["code"] == "parameter_unknown"
    assert _counts() == before


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "code"),
    [
        ("{not json", "application/json", 400, "json_invalid"),
        ('{"amount": NaN}', "application/json", 400, "json_invalid"),
        ("[1, 2, 3]", "application/json", 400, "parameter_invalid"),
        ('"just a string"', "application/json", 400, "parameter_invalid"),
        ("amount=100&asset=JPY", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
        ("<amount>100</amount>", "application/xml", 415, "unsupported_media_type"),
        ('{"amount": 100}', "text/plain", 415, "unsupported_media_type"),
        (b"\xff\xfe\x00garbage", "application/json", 400, "json_invalid"),
    ],
)
def test_malformed_bodies_and_wrong_content_types(api: Api, world: World, raw: Any, content_type: str, status: int, code: str) -> None:
    before = _counts()
    r = api.post("/v1/terminal/payments", world.terminal.key, raw=raw, content_type=content_type)
    assert r.status_code == status, r.content
    assert error_of(r)["code"] == code
    assert _counts() == before


def test_nul_bytes_everywhere_are_400_or_404_never_500(api: Api, world: World) -> None:
    r = api.post("/v1/admin/customers", world.staff.key, {"name": "evil\x00name"})
    assert r.status_code == 400 and error_of(r)["param"] == "name"
    r = api.get("/v1/customer/transactions", world.customer.key, {"asset": "JP\x00Y"})
    assert r.status_code == 400 and error_of(r)["param"] == "asset"
    r = api.get("/v1/customer/transactions", world.customer.key, {"cursor": "\x00"})
    assert r.status_code == 400
    r = api.get("/v1/terminal/payments/pay_%00abc", world.terminal.key)
    assert r.status_code == 404 and error_of(r)["code"] == "resource_missing"
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": "ptok_\x00", "asset": "JPY", "amount": 1})
    assert r.status_code == 400


def test_body_over_the_limit_is_413(api: Api, world: World, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    big = json.dumps({"name": "x" * 5000})
    r = api.post("/v1/admin/customers", world.staff.key, raw=big)
    assert r.status_code == 413, r.content
    assert error_of(r)["code"] == "request_too_large"


def test_405_404_and_unknown_tenant_host_use_the_envelope(api: Api, world: World) -> None:
    r = api.call("DELETE", "/v1/customer/wallet", world.customer.key)
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"
    r = api.get("/v1/customer/nothing-here", world.customer.key)
    assert r.status_code == 404 and error_of(r)["code"] == "resource_missing"
    r = Client(HTTP_HOST="unknown.example").get("/v1/customer/wallet")
    assert r.status_code == 404 and error_of(r)["code"] == "resource_missing"


def test_auth_errors_use_the_envelope(api: Api, world: World) -> None:
    checks: list[tuple[dict[str, str], str]] = [
        ({}, "api_key_missing"),
        ({"HTTP_AUTHORIZATION": "Bearer ck_nope"}, "api_key_invalid"),
        ({"HTTP_AUTHORIZATION": "Basic dXNlcjpwYXNz"}, "api_key_invalid"),
        ({"HTTP_AUTHORIZATION": "Bearer " + "x" * 5000}, "api_key_invalid"),
        ({"HTTP_AUTHORIZATION": "Bearer ck_\u00e9\u00e9"}, "api_key_invalid"),
    ]
    for headers, code in checks:
        r = api.client.get("/v1/customer/wallet", **headers)
        assert r.status_code == 401, (headers, r.content)
        assert error_of(r)["code"] == code and error_of(r)["type"] == "authentication_error"
        assert r["WWW-Authenticate"].startswith("Bearer")
    r = api.get("/v1/customer/wallet", world.merchant.key)
    assert r.status_code == 403 and error_of(r)["type"] == "permission_error"


def test_throttle_per_key_answers_429_with_retry_after(api: Api, world: World, tenant: Any, throttle_clock_held: float) -> None:
    tenant.extra_settings = {"throttle_rates": {"api_key": "3/min"}}
    tenant.save(update_fields=["extra_settings"])
    statuses = [api.get("/v1/customer/wallet", world.customer.key).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    r = api.get("/v1/customer/wallet", world.customer.key)
    assert error_of(r)["code"] == "rate_limited" and error_of(r)["type"] == "rate_limit_error"
    assert 1 <= int(r["Retry-After"]) <= 61
    # another key of the same tenant is not affected
    assert api.get("/v1/customer/wallet", world.customer2.key).status_code == 200


def test_throttle_windows_count_each_request_and_expire_once(api: Api, world: World, tenant: Any, monkeypatch: Any) -> None:
    """Each request adds one to its key's and its tenant's window counters, in Redis; a
    counter gets its TTL (the window and a second) when it is made, and later requests
    in the window do not push it back. The throttles' clock is held inside one window."""
    from types import SimpleNamespace

    from apikit import throttling
    from fastpath.fastredis import fast_redis

    monkeypatch.setattr(throttling, "time", SimpleNamespace(time=lambda: 1_800_000_030.0))
    tenant.extra_settings = {"throttle_rates": {"api_key": "100/min", "tenant": "1000/min"}}
    tenant.save(update_fields=["extra_settings"])
    redis = fast_redis()
    pattern = f"tally:throttle:{tenant.schema_name}:*"
    for stale in redis.scan_iter(match=pattern):
        redis.delete(stale)
    assert api.get("/v1/customer/wallet", world.customer.key).status_code == 200
    counters = {key.decode().split(":")[3]: key for key in redis.scan_iter(match=pattern)}
    assert sorted(counters) == ["api_key", "tenant"]
    assert all(redis.get(key) == b"1" and 0 < redis.ttl(key) <= 61 for key in counters.values())
    for key in counters.values():
        redis.expire(key, 1000)  # as if the TTL were longer: NX leaves it alone
    assert api.get("/v1/customer/wallet", world.customer.key).status_code == 200
    assert sorted(key.decode().split(":")[3] for key in redis.scan_iter(match=pattern)) == ["api_key", "tenant"]
    assert all(redis.get(key) == b"2" and 61 < redis.ttl(key) <= 1000 for key in counters.values())
    for stale in redis.scan_iter(match=pattern):
        redis.delete(stale)


def test_throttle_per_tenant(api: Api, world: World, tenant: Any, throttle_clock_held: float) -> None:
    tenant.extra_settings = {"throttle_rates": {"tenant": "2/s"}}
    tenant.save(update_fields=["extra_settings"])
    keys: list[Callable[[], Any]] = [lambda k=k: api.get("/v1/merchant/stores", k) for k in (world.merchant.key, world.merchant2.key)]
    statuses = [keys[i % 2]().status_code for i in range(6)]
    assert 429 in statuses


def test_text_fields_refuse_numbers_and_objects(api: Api, world: World) -> None:
    for bad in (0, 1.5, True, ["x"], {"x": 1}):
        r = api.post("/v1/admin/merchants", world.staff.key, {"name": bad})
        assert r.status_code == 400 and error_of(r)["param"] == "name", bad
        r = api.post("/v1/customer/topups", world.customer.key, {"asset": "JPY", "amount": 1, "payment_method": bad})
        assert r.status_code == 400 and error_of(r)["param"] == "payment_method", bad


@pytest.mark.parametrize(
    "raw",
    [
        '{"amount": ' + "[" * 3000 + "]" * 3000 + "}",  # RecursionError inside json, not ValueError
        '{"name": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}",  # deeper than any body of ours
        '{"\\ud800": 1}',  # a lone surrogate as a key: echoed back as `param` it cannot be rendered
        '{"name": "Eve \\udfff"}',  # ... as a value it cannot be stored in PostgreSQL
    ],
    ids=["deep-recursion", "deep", "surrogate-key", "surrogate-value"],
)
@pytest.mark.parametrize("path", ["/v1/admin/customers", "/v1/merchant/refunds", "/v1/terminal/payments"])
def test_bodies_python_json_accepts_but_we_cannot_handle_are_400(api: Api, world: World, raw: str, path: str) -> None:
    bearer = {"admin": world.staff.key, "merchant": world.merchant.key, "terminal": world.terminal.key}[path.split("/")[2]]
    before = (Payment.objects.count(), Refund.objects.count())
    r = api.call("POST", path, bearer, raw=raw)
    assert r.status_code == 400, r.content
    assert error_of(r)["type"] == "invalid_request_error"
    assert (Payment.objects.count(), Refund.objects.count()) == before
