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


def test_v1_errors_are_the_envelope_even_with_debug_on(api: Api, world: World, settings) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client

    from tests.api.conftest import error_of

    settings.DEBUG = True
    for path in ("/v1/nope", "/v1/merchant/payments/PAY_abc", "/v1/merchant/payments/pay_" + "x" * 60):
        response = api.get(path, world.merchant.key)
        assert response.status_code == 404, (path, response.content[:200])
        assert error_of(response)["code"] == "resource_missing"
    # An unknown host names nothing internal; a host in capitals is the same host.
    unknown = Client(HTTP_HOST="nobody.test.localhost").get("/v1/customer/wallet")
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "resource_missing"
    assert b"hostname" not in unknown.content and b"View" not in unknown.content
    plain = Client(HTTP_HOST="nobody.test.localhost").get("/admin/")
    assert plain.status_code == 404 and plain.content == b"Not found"
    upper = Client(HTTP_HOST=world.host.upper()).get("/v1/customer/wallet", HTTP_AUTHORIZATION=f"Bearer {world.customer.key}")
    assert upper.status_code == 200, upper.content[:200]


def test_failed_authentication_is_throttled_per_address_and_key_prefix(api: Api, world: World, settings, throttle_clock_held) -> None:  # type: ignore[no-untyped-def]
    import random

    from tests.api.conftest import error_of

    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**rates, "auth_failure": "5/min"}}
    address = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(256)}"
    prefix = "ck_" + "".join(random.choices("abcdefghijklmnopqrstuvwxyz", k=4))  # counters are shared: a fresh prefix
    statuses = [
        api.client.get("/v1/customer/wallet", HTTP_AUTHORIZATION=f"Bearer {prefix}wrong{n}", REMOTE_ADDR=address).status_code for n in range(7)
    ]
    assert statuses[:5] == [401] * 5 and statuses[5:] == [429, 429], statuses
    throttled = api.client.get("/v1/customer/wallet", HTTP_AUTHORIZATION=f"Bearer {prefix}wrongX", REMOTE_ADDR=address)
    assert error_of(throttled)["code"] == "rate_limited" and int(throttled["Retry-After"]) >= 1
    # A good key from another address is not held up by this address's failures.
    assert api.get("/v1/customer/wallet", world.customer.key).status_code == 200


def test_failed_authentication_counts_the_address_the_trusted_proxy_saw(api: Api, world: World, settings, throttle_clock_held) -> None:  # type: ignore[no-untyped-def]
    import random

    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**rates, "auth_failure": "3/min"}}
    proxy = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(256)}"

    def failed(client_ip: str, n: int, prefix: str) -> int:
        return int(api.client.get(
            "/v1/customer/wallet", HTTP_AUTHORIZATION=f"Bearer {prefix}wrong{n}", REMOTE_ADDR=proxy,
            HTTP_X_FORWARDED_FOR=f"6.6.6.6, {client_ip}",  # the client wrote the first hop; the proxy appended the second
        ).status_code)

    def prefix() -> str:
        return "ck_" + "".join(random.choices("abcdefghijklmnopqrstuvwxyz", k=6))

    # Behind one trusted proxy: each client address has its own count.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    noisy = f"192.0.2.{random.randrange(256)}"
    assert [failed(noisy, n, prefix()) for n in range(4)] == [401, 401, 401, 429]
    assert failed(f"198.51.100.{random.randrange(256)}", 0, prefix()) == 401  # another client behind the same proxy
    # With no proxy configured the header is the client's word and is ignored: one address.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": None}
    proxy = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(256)}"
    assert [failed(f"203.0.113.{n}", n, prefix()) for n in range(4)] == [401, 401, 401, 429]
