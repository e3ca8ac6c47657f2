"""Edges every /v1/ response keeps: our own request id, and no caching."""

from __future__ import annotations

from tests.api.conftest import Api, World


def test_a_client_request_id_never_becomes_ours(api: Api, world: World) -> None:
    response = api.get("/v1/customer/wallet", world.customer.key, **{"X-Request-Id": "client-chosen-id-123"})
    assert response.status_code == 200
    assert response["Request-Id"].startswith("req_") and response["Request-Id"] != "client-chosen-id-123"
    assert response["Client-Request-Id"] == "client-chosen-id-123"
    junk = api.get("/v1/customer/wallet", world.customer.key, **{"X-Request-Id": "bad id with junk"})
    assert junk.status_code == 200 and "Client-Request-Id" not in junk


def test_every_v1_response_is_no_store(api: Api, world: World) -> None:
    created = api.post("/v1/customer/payment_tokens", world.customer.key, {})  # carries a secret shown once
    read = api.get("/v1/customer/wallet", world.customer.key)
    refused = api.get("/v1/customer/wallet", None)
    unknown = api.get("/v1/nope", world.customer.key)
    for response, status in ((created, 201), (read, 200), (refused, 401), (unknown, 404)):
        assert response.status_code == status, response.content
        assert response["Cache-Control"] == "no-store", response.headers
