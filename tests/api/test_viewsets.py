"""The faces are DRF viewsets on one router per face (config/api_urls.py): every /v1/ face
route is served by a FaceViewSet of its face, the OpenAPI document lists exactly the recorded
operations, and every POST action (create, POST-to-update, @action) goes through the one
idempotency mechanism."""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

from django.urls import Resolver404, resolve
from drf_spectacular.generators import SchemaGenerator

from apikit.base import FaceViewSet
from payments.services.adjustments import adjustment_create
from tests.api.conftest import Api, World, error_of
from tests.api.test_matrix import ENDPOINTS, Objects, objects  # noqa: F401 - the fixture

# Recorded from the schema of the former APIViews, before the move to viewsets.
OPERATIONS = sorted(line for line in (pathlib.Path(__file__).parent / "openapi_operations.txt").read_text().splitlines() if line)
SAMPLE_ID = "abc_Z9"  # shaped like any object id


def _schema_operations() -> list[str]:
    doc = SchemaGenerator(patterns=None).get_schema(request=None, public=True)
    return sorted(f"{method.upper()} {path}" for path, ops in doc["paths"].items() for method in ops)


# Documented operations that are not a face's: the inbound PSP webhook (signed, no API key).
NON_FACE_OPERATIONS = ["POST /v1/psp/webhooks/{gateway}"]


def test_openapi_operations_are_the_recorded_ones() -> None:
    operations = _schema_operations()
    assert [op for op in operations if op not in NON_FACE_OPERATIONS] == OPERATIONS
    assert all(op in operations for op in NON_FACE_OPERATIONS)


def test_routes_are_the_recorded_operations() -> None:
    assert sorted(f"{method} {template}" for method, template, _face in ENDPOINTS) == OPERATIONS


def test_every_face_route_is_served_by_a_viewset_of_its_face() -> None:
    for operation in OPERATIONS:
        method, template = operation.split(" ")
        path = template.replace("{", "").replace("}", "")  # any placeholder -> an id-shaped value
        path = "/".join(SAMPLE_ID if part.endswith("_id") else part for part in path.split("/"))
        match = resolve(path)
        cls = match.func.cls  # type: ignore[attr-defined]
        assert issubclass(cls, FaceViewSet), operation
        assert cls.face == template.split("/")[2], operation
        assert method.lower() in match.func.actions, operation  # type: ignore[attr-defined]


def test_malformed_ids_match_no_route() -> None:
    for bad in ("x", "abc_", "ABC_1", "abc_" + "1" * 41, "abc_1\x00", "abc_1.json", "abc_1/"):
        for route in ("/v1/customer/payments/", "/v1/merchant/payment_intents/", "/v1/admin/api_keys/"):
            try:
                resolve(route + bad)
            except Resolver404:
                continue
            raise AssertionError(route + bad)
        for suffix in ("/confirm", ""):
            try:
                resolve(f"/v1/merchant/payment_intents/{bad}{suffix}")
            except Resolver404:
                continue
            raise AssertionError(bad)


def test_every_post_requires_an_idempotency_key(api: Api, world: World, objects: Objects) -> None:  # noqa: F811
    keys = {"customer": world.customer.key, "terminal": world.terminal.key, "merchant": world.merchant.key, "admin": world.staff.key}
    posts = [(template, face) for method, template, face in ENDPOINTS if method == "POST"]
    assert len(posts) == sum(1 for op in OPERATIONS if op.startswith("POST "))
    for template, face in posts:
        r = api.post(template.format(**objects.ids), keys[face], {}, idem=None)
        assert r.status_code == 400, (template, r.status_code, r.content)
        assert error_of(r)["code"] == "idempotency_key_missing", template


def _twice(api: Api, path: str, key: str, body: dict[str, Any]) -> tuple[Any, Any]:
    idem = uuid.uuid4().hex
    first = api.post(path, key, body, idem=idem)
    again = api.post(path, key, body, idem=idem)
    return first, again


def test_create_update_and_actions_are_replayed_not_rerun(api: Api, world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    mk = world.merchant.key
    # create
    first, again = _twice(api, "/v1/merchant/payment_intents", mk, {"customer": world.customer.id, "asset": "JPY", "amount": 500})
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true" and again.content == first.content
    intent = first.json()["id"]
    assert len(api.get("/v1/merchant/payment_intents", mk).json()["data"]) == 1
    # POST-to-update on the detail route
    first, again = _twice(api, f"/v1/merchant/payment_intents/{intent}", mk, {"amount": 700})
    assert first.status_code == 200 and first.json()["amount"] == 700
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    # a detail @action: run again it would be a 409 (already canceled); replayed, it is the first answer
    first, again = _twice(api, f"/v1/merchant/payment_intents/{intent}/cancel", mk, {})
    assert first.status_code == 200 and first.json()["status"] == "canceled"
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert api.post(f"/v1/merchant/payment_intents/{intent}/cancel", mk, {}).status_code == 409
    # the same key with another body is refused, not executed
    other = api.post("/v1/merchant/payment_intents", mk, {"customer": world.customer.id, "asset": "JPY", "amount": 5}).json()["id"]
    idem = uuid.uuid4().hex
    assert api.post(f"/v1/merchant/payment_intents/{other}/confirm", mk, {}, idem=idem).status_code == 200
    reused = api.post(f"/v1/merchant/payment_intents/{other}/confirm", mk, {"x": 1}, idem=idem)
    assert reused.status_code == 422 and error_of(reused)["code"] == "idempotency_key_reused"
    # webhooks.api: create (secret sealed), update, rotate_secret
    first, again = _twice(api, "/v1/merchant/webhook_endpoints", mk, {"url": "https://93.184.215.14/h", "enabled_events": ["*"]})
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true" and again.content == first.content
    endpoint = first.json()["id"]
    first, again = _twice(api, f"/v1/merchant/webhook_endpoints/{endpoint}", mk, {"description": "orders"})
    assert first.status_code == 200 and again["Idempotent-Replayed"] == "true" and again.content == first.content
    first, again = _twice(api, f"/v1/merchant/webhook_endpoints/{endpoint}/rotate_secret", mk, {"overlap_seconds": 0})
    assert first.status_code == 200 and again["Idempotent-Replayed"] == "true" and again.content == first.content


def test_no_put_patch_or_delete(api: Api, world: World) -> None:
    for path in ("/v1/merchant/payment_intents/pi_x", "/v1/merchant/webhook_endpoints/we_x", "/v1/admin/customers"):
        for method in ("PUT", "PATCH", "DELETE"):
            r = api.call(method, path, world.merchant.key if "merchant" in path else world.staff.key, {})
            assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed", (method, path)
