"""The OpenAPI document: every face route, bearer auth, error envelope, Idempotency-Key."""

from __future__ import annotations

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
