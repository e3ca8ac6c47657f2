"""The OpenAPI document: every face route, bearer auth, error envelope, Idempotency-Key."""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped]
from django.test import Client

from tests.api.conftest import World
from tests.api.test_matrix import ENDPOINTS


def test_schema_documents_every_endpoint_auth_errors_and_idempotency(world: World) -> None:
    r = Client(HTTP_HOST=world.host).get("/v1/schema")
    assert r.status_code == 200
    doc = yaml.safe_load(r.content)
    assert doc["openapi"].startswith("3.")
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for method, template, _face in ENDPOINTS:
        op = doc["paths"][template][method.lower()]
        assert {"bearerAuth": []} in op["security"], template
        for code in ("400", "401", "403", "404", "429"):
            assert code in op["responses"], (template, code)
            assert op["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
        if method == "POST":
            assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in op["parameters"]), template
            assert "422" in op["responses"] and "409" in op["responses"]
    assert Client(HTTP_HOST=world.host).get("/v1/docs").status_code == 200


def test_the_schema_tells_each_tenant_its_truth_and_nothing_internal(world: World, tenant: Any) -> None:
    from tests.test_idempotency import tenant_settings_set

    doc = yaml.safe_load(Client(HTTP_HOST=world.host).get("/v1/schema").content)
    payment = doc["paths"]["/v1/terminal/payments"]["post"]
    key = next(p for p in payment["parameters"] if p["name"] == "Idempotency-Key")
    assert key["required"] is True and key["schema"]["pattern"].startswith("^[\\x21-\\x7e]")
    body = doc["components"]["schemas"][payment["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]]
    asset = body["properties"]["asset"]
    codes = asset.get("enum") or doc["components"]["schemas"][asset["allOf"][0]["$ref"].split("/")[-1]]["enum"]  # hoisted enums
    assert {"JPY", "POINT", "CARBON"} <= set(codes), codes and body["properties"]["amount"]["type"] == "integer"
    assert "414" in payment["responses"] and "431" in payment["responses"]
    # Developers' docstrings (mixins, locks, SPEC sections) never reach a client's docs.
    descriptions = [op.get("description", "") for ops in doc["paths"].values() for op in ops.values() if isinstance(op, dict)]
    assert not any("Put it before APIView" in d or "Locks:" in d for d in descriptions)
    # A tenant that makes the key optional on a face is told so on that face only.
    tenant_settings_set(tenant, idempotency_terminal="optional")
    relaxed = yaml.safe_load(Client(HTTP_HOST=world.host).get("/v1/schema").content)
    parameters = relaxed["paths"]["/v1/terminal/payments"]["post"]["parameters"]
    assert next(p for p in parameters if p["name"] == "Idempotency-Key").get("required", False) is False
    assert next(p for p in relaxed["paths"]["/v1/customer/transfers"]["post"]["parameters"] if p["name"] == "Idempotency-Key")["required"] is True


def test_the_customer_face_documents_payments_and_refunds_without_the_fee(world: World) -> None:
    doc = yaml.safe_load(Client(HTTP_HOST=world.host).get("/v1/schema").content)

    def shape(path: str, method: str = "get") -> set[str]:
        ref = doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        return set(doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"])

    assert {"fee", "net"} <= shape("/v1/merchant/payments/{payment_id}") and "fee" in shape("/v1/merchant/refunds/{refund_id}")
    assert "amount" in shape("/v1/customer/payments/{payment_id}") and not {"fee", "net"} & shape("/v1/customer/payments/{payment_id}")
    assert "amount" in shape("/v1/customer/refunds/{refund_id}") and "fee" not in shape("/v1/customer/refunds/{refund_id}")
