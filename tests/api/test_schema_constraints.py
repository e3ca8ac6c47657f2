"""The OpenAPI schema states the rules the server enforces, so a request the schema calls
valid is not refused as malformed (what schemathesis checks from outside; the full runs
are recorded in docs/SCHEMA_CHECK.md). Cheap versions of the cases it once found."""

from __future__ import annotations

import re
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import jsonschema_rs
import pytest
import schemathesis
import yaml  # type: ignore[import-untyped]
from django.test import Client

from apikit.fields import WHITESPACE_CLASS
from payments.services.adjustments import adjustment_create
from tests.api.conftest import Api, World, error_of
from webhooks.services import endpoints as endpoint_services


@pytest.fixture
def doc(world: World) -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load(Client(HTTP_HOST=world.host).get("/v1/schema").content)
    return schema


def _body_schema(doc: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    """The request body's schema, with the components its $refs point into."""
    ref = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return {**doc["components"]["schemas"][ref.rsplit("/", 1)[1]], "components": doc["components"]}


def _param(doc: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    return dict(next(p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == name)["schema"])


def _valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft4Validator(schema).is_valid(value)  # OpenAPI 3.0 schemas are draft 4 with extras


def _enum(doc: dict[str, Any], prop: dict[str, Any]) -> list[Any]:
    for part in [prop, *prop.get("allOf", [])]:
        if "enum" in part:
            return list(part["enum"])
        if "$ref" in part:
            return list(doc["components"]["schemas"][part["$ref"].rsplit("/", 1)[1]]["enum"])
    raise AssertionError(prop)


def test_schemathesis_reads_every_operation(doc: dict[str, Any]) -> None:
    operations = list(schemathesis.openapi.from_dict(doc).get_all_operations())
    assert len(operations) == sum(len([m for m in ops if m in {"get", "post", "patch", "put", "delete"}]) for ops in doc["paths"].values())
    for result in operations:
        result.ok()  # raises on an operation schemathesis cannot use


def test_every_request_body_refuses_unknown_fields_as_the_server_does(doc: dict[str, Any], api: Api, world: World) -> None:
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {}).get("application/json") if isinstance(operation, dict) else None
            if content:
                name = content["schema"]["$ref"].rsplit("/", 1)[1]
                assert doc["components"]["schemas"][name].get("additionalProperties") is False, (method, path)
    r = api.post("/v1/customer/contact", world.customer.key, {"email": "a@example.com", "nickname": "x"})
    assert r.status_code == 400 and error_of(r)["code"] == "parameter_unknown"


def test_object_references_state_their_type_prefix(doc: dict[str, Any], api: Api, world: World) -> None:
    transfer = _body_schema(doc, "/v1/customer/transfers")
    assert not _valid(transfer, {"to_customer": "aa_0", "asset": "JPY", "amount": 1})  # once schema-valid, refused 400
    assert _valid(transfer, {"to_customer": "cus_0", "asset": "JPY", "amount": 1})
    r = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": "cus_0", "asset": "JPY", "amount": 1})
    assert r.status_code == 404, r.content  # well-formed, unknown: not a 400


def test_exactly_one_of_two_fields_is_stated(doc: dict[str, Any]) -> None:
    adjustment = _body_schema(doc, "/v1/admin/adjustments")
    base = {"asset": "JPY", "amount": 1, "direction": "credit", "reason": "r"}
    assert _valid(adjustment, {**base, "customer": "cus_0"}) and _valid(adjustment, {**base, "merchant": "mer_0"})
    assert not _valid(adjustment, {**base, "customer": "cus_0", "merchant": "mer_0"}) and not _valid(adjustment, base)
    payment = _body_schema(doc, "/v1/terminal/payments")
    assert not _valid(payment, {"asset": "JPY", "amount": 1, "customer": "cus_0", "customer_token": "ptok_12345678"})


def test_card_top_ups_list_only_currencies(doc: dict[str, Any]) -> None:
    codes = _enum(doc, _body_schema(doc, "/v1/customer/topups")["properties"]["asset"])
    assert "JPY" in codes and "POINT" not in codes and "CARBON" not in codes
    assert {"POINT", "CARBON"} <= set(_enum(doc, _body_schema(doc, "/v1/customer/transfers")["properties"]["asset"]))


def test_any_cursor_of_the_documented_form_is_a_position(doc: dict[str, Any], api: Api, world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=100, direction="credit", reason="a")
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=200, direction="credit", reason="b")
    pattern = re.compile(_param(doc, "/v1/customer/transactions", "cursor")["pattern"])
    first = api.get("/v1/customer/transactions", world.customer.key, {"limit": 1}).json()
    assert pattern.search(first["next_cursor"])  # what the server issues, the schema allows
    second = api.get("/v1/customer/transactions", world.customer.key, {"limit": 1, "cursor": first["next_cursor"]}).json()
    assert second["data"] and second["data"][0]["id"] != first["data"][0]["id"]
    # Once refused as "not issued by this list": every schema-valid value is a position.
    for cursor in ("0.0", "0.a", "9999999999999999.zz_Z", "1.123456789012345678", "12.1234567890123456789"):
        assert pattern.search(cursor)
        for path in ("/v1/customer/transactions", "/v1/customer/payments", "/v1/admin/adjustments"):
            key = world.staff.key if path.startswith("/v1/admin") else world.customer.key
            r = api.get(path, key, {"cursor": cursor})
            assert r.status_code == 200, (path, cursor, r.content)
    for bad in ("0", "not-a-cursor", "1.a-b", "x" * 90):
        assert not pattern.search(bad)
        r = api.get("/v1/customer/transactions", world.customer.key, {"cursor": bad})
        assert r.status_code == 400 and error_of(r)["code"] == "cursor_invalid", bad


def test_balance_history_days_are_bounded_and_wide_windows_are_paged(doc: dict[str, Any], api: Api, world: World) -> None:
    day = _param(doc, "/v1/merchant/balance/history", "day_from")
    assert _valid(day, "1970-01-01") and _valid(day, "9000-12-31") and not _valid(day, "0001-01-01") and not _valid(day, "9999-12-31")
    today = datetime.now(UTC).date()
    r = api.get("/v1/merchant/balance/history", world.merchant.key, {"day_from": "2000-01-01"})  # once 400: wider than 366 days
    assert r.status_code == 200 and r.json()["next_cursor"] == (today - timedelta(days=366)).isoformat()
    r = api.get("/v1/merchant/balance/history", world.merchant.key, {"day_from": "2000-01-02", "day_to": "2000-01-01"})
    assert r.status_code == 200 and r.json()["data"] == []


def test_webhook_endpoint_fields_state_what_the_server_takes(doc: dict[str, Any], api: Api, world: World, monkeypatch: Any) -> None:
    create = _body_schema(doc, "/v1/merchant/webhook_endpoints")
    long_host = ".".join(["a" * 63] * 4) + ".com"
    assert not _valid(create, {"url": f"https://{long_host}/h", "enabled_events": ["*"]})  # once schema-valid, refused 400
    assert not _valid(create, {"url": "https://hooks.example.com/h", "enabled_events": ["0"]})
    body = {"url": "https://hooks.example.invalid/h", "enabled_events": ["payment.succeeded"]}
    assert _valid(create, body)
    # Registration resolves the name (one that does not resolve is refused): here it
    # resolves to a public address, as a merchant's real host would.
    resolve = socket.getaddrinfo
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda host, *a, **k: resolve("93.184.215.14" if host == "hooks.example.invalid" else host, *a, **k)
    )
    assert api.post("/v1/merchant/webhook_endpoints", world.merchant.key, body).status_code == 201
    # A merchant at its endpoint limit: a state of its account (409), not a malformed request.
    monkeypatch.setattr(endpoint_services, "MAX_ENDPOINTS_PER_MERCHANT", 1)
    r = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, body)
    assert r.status_code == 409 and error_of(r)["code"] == "webhook_endpoint_limit_reached"


def test_free_text_states_its_rules_as_sent(doc: dict[str, Any], api: Api, world: World) -> None:
    merchant = _body_schema(doc, "/v1/admin/merchants")
    for name in ("a\x00b", " \r\n", "", "\r" + "x" * 200):  # NUL, blank once trimmed, too long as sent
        assert not _valid(merchant, {"name": name}), name
        r = api.post("/v1/admin/merchants", world.staff.key, {"name": name})
        assert r.status_code == 400 and error_of(r)["param"] == "name", (name, r.content)
    assert _valid(merchant, {"name": "  Shop  "})
    r = api.post("/v1/admin/merchants", world.staff.key, {"name": "  Shop  "})
    assert r.status_code == 201 and r.json()["name"] == "Shop"  # trimmed, as before


def test_non_blank_text_states_the_whitespace_the_server_trims(doc: dict[str, Any], api: Api, world: World) -> None:
    """The report: a terminal name of " \\u001d" matched the schema's pattern (where `\\s`
    is ECMA 262's, as schemathesis reads it) and was refused as blank, since the server
    trims what Python's str.strip() trims. The pattern now spells that set out, so every
    engine reads it alike."""
    name = _body_schema(doc, "/v1/admin/terminals")["properties"]["name"]
    ecma = jsonschema_rs.validator_for({"type": "string", "pattern": name["pattern"]})
    python = re.compile(name["pattern"])
    assert "".join(c for c in map(chr, range(0x110000)) if re.fullmatch(f"[{WHITESPACE_CLASS}]", c)) == "".join(
        c for c in map(chr, range(0x110000)) if c.isspace()
    )
    for text in (" \x1d", "\x1c\x1d\x1e\x1f", " \x85", "\u3000", "\ufeff", " \x01", "a", " a\x1d", "\t"):
        accepted = bool(text.strip())
        assert ecma.is_valid(text) == accepted and bool(python.search(text)) == accepted, repr(text)
        r = api.post("/v1/admin/terminals", world.staff.key, {"store": world.store.pk, "name": text})
        assert r.status_code == (201 if accepted else 400), (repr(text), r.content)


@pytest.mark.parametrize("path", ["/v1/customer/transactions", "/v1/customer/payments", "/v1/admin/adjustments"])
def test_created_filters_take_every_schema_valid_date_time(doc: dict[str, Any], api: Api, world: World, path: str) -> None:
    """The report: `created_lt=0001-01-01T12:55:55.730+14:25` is a valid date-time and was
    answered 400 "Datetime value out of range" (it is before the year 1 in UTC). A bound
    past either end of the representable range selects what the end would."""
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=100, direction="credit", reason="a")
    key = world.staff.key if path.startswith("/v1/admin") else world.customer.key
    everything = api.get(path, key).json()["data"]
    early, late = "0001-01-01T12:55:55.730+14:25", "9999-12-31T23:00:00-05:00"
    assert _valid(_param(doc, path, "created_lt"), early)
    for params, rows in (
        ({"created_lt": early}, []), ({"created_gte": early}, everything),
        ({"created_lt": late}, everything), ({"created_gte": late}, []),
    ):
        r = api.get(path, key, params)
        assert r.status_code == 200, (params, r.content)
        assert r.json()["data"] == rows, params
    assert api.get(path, key, {"created_lt": "0001-13-01T00:00:00Z"}).status_code == 400  # not a date-time at all
