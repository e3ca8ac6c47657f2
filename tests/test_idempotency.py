"""Idempotency mechanism through the DRF mixin (SPEC 1.1-1.3, 6), on real PostgreSQL/Redis.

Views are test-only (tests/idempotency_urls.py); tests commit (live_tenant) and use
unique keys, principals and names so they never see each other's rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from idempotency import metrics
from idempotency.models import IdempotencyRecord
from tenants.models import Tenant
from tests import idempotency_urls
from tests.conftest import TENANT_A, TENANT_B, in_tenant
from wallets.models import Customer

pytestmark = pytest.mark.urls("tests.idempotency_urls")


def uid(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex[:16]


def post(
    path: str, body: Any, *, key: str | None = None, principal: str = "p-default", host: str = TENANT_A["domain"], raw: bytes | None = None
) -> Any:
    headers: dict[str, str] = {"HTTP_X_TEST_PRINCIPAL": principal}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    client = Client(HTTP_HOST=host, raise_request_exception=False)
    data = raw if raw is not None else json.dumps(body)
    response = client.post(path, data=data, content_type="application/json", **headers)
    # The client runs in this thread: its tenant middleware switched our connection.
    connection.set_schema(TENANT_A["schema_name"])
    return response


def customers_named(name: str) -> int:
    return Customer.objects.filter(name=name).count()


def sample(metric: Any, **labels: str) -> float:
    return float(metric.labels(**labels)._value.get()) if labels else float(metric._value.get())


def tenant_settings_set(tenant: Tenant, **fields: Any) -> None:
    """Change a tenant's settings the way the admin does (save): the per-process host ->
    tenant cache is cleared on save, so the next request sees them."""
    connection.set_schema_to_public()
    row = Tenant.objects.get(pk=tenant.pk)
    for name, value in fields.items():
        setattr(row, name, value)
    row.save(update_fields=list(fields))
    connection.set_tenant(tenant)


@pytest.fixture
def mode_reset(live_tenant: Tenant) -> Iterator[Tenant]:
    yield live_tenant
    tenant_settings_set(live_tenant, idempotency_customer="mandatory", idempotency_wait_ms=5000)
    connection.set_tenant(live_tenant)


def test_first_request_executes_and_replays_are_byte_identical(live_tenant: Tenant) -> None:
    key, name, principal = uid("k-"), uid("n-"), uid("p-")
    first = post("/v1/test/effect", {"name": name, "amount": 100}, key=key, principal=principal)
    assert first.status_code == 201, first.content
    assert "Idempotent-Replayed" not in first
    replays_before = sample(metrics.IDEMPOTENCY_REPLAYS, source="postgres") + sample(metrics.IDEMPOTENCY_REPLAYS, source="redis")
    for _ in range(3):
        again = post("/v1/test/effect", {"amount": 100.0, "name": name}, key=key, principal=principal)  # same request, other spelling
        assert again.status_code == 201
        assert again.content == first.content
        assert again["Idempotent-Replayed"] == "true"
        assert again["Original-Request"] == first["Request-Id"]
        assert again["Request-Id"] != first["Request-Id"]
        assert again["Content-Type"] == first["Content-Type"]
    assert customers_named(name) == 1
    assert idempotency_urls.CALLS[name] == 1
    replays_after = sample(metrics.IDEMPOTENCY_REPLAYS, source="postgres") + sample(metrics.IDEMPOTENCY_REPLAYS, source="redis")
    assert replays_after - replays_before == 3
    record = IdempotencyRecord.objects.get(principal_id=principal, key=key)
    assert record.state == "completed" and record.response_status == 201 and bytes(record.response_body) == first.content
    assert record.request_id == first["Request-Id"] and record.scope == "terminal" and record.fence == 1
    assert record.minted["thing"] == json.loads(first.content)["id"]


def test_same_key_different_body_is_422_and_nothing_runs(live_tenant: Tenant) -> None:
    key, name, principal = uid("k-"), uid("n-"), uid("p-")
    assert post("/v1/test/effect", {"name": name, "amount": 100}, key=key, principal=principal).status_code == 201
    before = sample(metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES)
    other = post("/v1/test/effect", {"name": name, "amount": 101}, key=key, principal=principal)
    assert other.status_code == 422
    error = json.loads(other.content)["error"]
    assert error["code"] == "idempotency_key_reused" and error["request_id"] == other["Request-Id"]
    assert set(error) == {"type", "code", "message", "param", "request_id"}
    assert customers_named(name) == 1 and idempotency_urls.CALLS[name] == 1
    assert sample(metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES) == before + 1
    # Another path with the same key and body is another request too.
    assert post("/v1/test/optional", {"name": name, "amount": 100}, key=key, principal=principal).status_code == 422


def test_other_principal_and_other_tenant_are_separate_key_spaces(live_tenant: Tenant, tenant_b: Tenant) -> None:
    key, name = uid("k-"), uid("n-")
    a1 = post("/v1/test/effect", {"name": name}, key=key, principal="p-one-" + name)
    a2 = post("/v1/test/effect", {"name": name}, key=key, principal="p-two-" + name)
    b1 = post("/v1/test/effect", {"name": name}, key=key, principal="p-one-" + name, host=TENANT_B["domain"])
    assert (a1.status_code, a2.status_code, b1.status_code) == (201, 201, 201)
    assert "Idempotent-Replayed" not in a2 and "Idempotent-Replayed" not in b1
    assert len({json.loads(r.content)["id"] for r in (a1, a2, b1)}) == 3
    assert customers_named(name) == 2
    with in_tenant(tenant_b):
        assert customers_named(name) == 1
        assert IdempotencyRecord.objects.filter(key=key).count() == 1
    # Replays stay in their own tenant.
    b2 = post("/v1/test/effect", {"name": name}, key=key, principal="p-one-" + name, host=TENANT_B["domain"])
    assert b2.content == b1.content and b2["Idempotent-Replayed"] == "true"


def test_missing_key_is_400_when_mandatory_and_executes_when_optional(mode_reset: Tenant) -> None:
    name = uid("n-")
    before = sample(metrics.IDEMPOTENCY_MISSING_KEYS, face="customer", mode="mandatory")
    refused = post("/v1/test/optional", {"name": name})
    assert refused.status_code == 400
    assert json.loads(refused.content)["error"]["code"] == "idempotency_key_missing"
    assert customers_named(name) == 0
    assert sample(metrics.IDEMPOTENCY_MISSING_KEYS, face="customer", mode="mandatory") == before + 1

    tenant_settings_set(mode_reset, idempotency_customer="optional")
    before_opt = sample(metrics.IDEMPOTENCY_MISSING_KEYS, face="customer", mode="optional")
    assert post("/v1/test/optional", {"name": name}).status_code == 201
    assert post("/v1/test/optional", {"name": name}).status_code == 201
    assert customers_named(name) == 2  # no key, no protection: executed twice, and counted
    assert sample(metrics.IDEMPOTENCY_MISSING_KEYS, face="customer", mode="optional") == before_opt + 2
    # The terminal face of the same tenant is still mandatory.
    assert post("/v1/test/effect", {"name": name}).status_code == 400


@pytest.mark.parametrize("bad", ["", " ", " lead", "trail ", "x" * 256, "caf\u00e9", "tab\there", "new\nline"])
def test_invalid_keys_are_400(live_tenant: Tenant, bad: str) -> None:
    name = uid("n-")
    client = Client(HTTP_HOST=TENANT_A["domain"], raise_request_exception=False)
    response = client.generic(
        "POST", "/v1/test/effect", json.dumps({"name": name}), content_type="application/json",
        HTTP_X_TEST_PRINCIPAL="p", HTTP_IDEMPOTENCY_KEY=bad,
    )
    assert response.status_code == 400
    error = json.loads(response.content)["error"]
    assert error["code"] == "idempotency_key_invalid" and error["param"] == "Idempotency-Key"
    assert customers_named(name) == 0


@pytest.mark.parametrize("good", ["a", "x" * 255, "order-123_ABC.~!@#$%^&*()", "with space"])
def test_valid_keys_are_accepted(live_tenant: Tenant, good: str) -> None:
    principal, name = uid("p-"), uid("n-")
    assert post("/v1/test/effect", {"name": name}, key=good, principal=principal).status_code == 201


def test_validation_error_is_not_stored_and_the_key_stays_usable(live_tenant: Tenant) -> None:
    key, principal, name = uid("k-"), uid("p-"), uid("n-")
    bad = post("/v1/test/effect", {"nom": name}, key=key, principal=principal)
    assert bad.status_code == 400
    assert not IdempotencyRecord.objects.filter(principal_id=principal, key=key).exists()
    good = post("/v1/test/effect", {"nom": name, "name": name}, key=key, principal=principal)
    assert good.status_code == 201 and customers_named(name) == 1


def test_business_refusal_is_stored_and_replayed_and_its_writes_rolled_back(live_tenant: Tenant) -> None:
    key, principal, name = uid("k-"), uid("p-"), uid("n-")
    refused = post("/v1/test/effect", {"name": name, "refuse": True}, key=key, principal=principal)
    assert refused.status_code == 402
    error = json.loads(refused.content)["error"]
    assert error["code"] == "insufficient_funds" and error["param"] == "amount"
    assert customers_named(name) == 0  # the view wrote a row before refusing: rolled back
    again = post("/v1/test/effect", {"name": name, "refuse": True}, key=key, principal=principal)
    assert again.status_code == 402 and again.content == refused.content and again["Idempotent-Replayed"] == "true"
    assert idempotency_urls.CALLS[name] == 1
    assert IdempotencyRecord.objects.get(principal_id=principal, key=key).response_status == 402


def test_crash_leaves_failed_retryable_and_the_retry_executes(live_tenant: Tenant) -> None:
    key, principal, name = uid("k-"), uid("p-"), uid("n-")
    crashed = post("/v1/test/effect", {"name": name, "crash": True}, key=key, principal=principal)
    assert crashed.status_code == 500
    assert customers_named(name) == 0
    record = IdempotencyRecord.objects.get(principal_id=principal, key=key)
    assert record.state == "failed_retryable" and record.response_body is None
    # The retry (same request) executes again; a different request is still refused.
    assert post("/v1/test/effect", {"name": name, "crash": False}, key=key, principal=principal).status_code == 422
    retried = post("/v1/test/effect", {"name": name, "crash": True}, key=key, principal=principal)
    assert retried.status_code == 500 and idempotency_urls.CALLS[name] == 2
    assert IdempotencyRecord.objects.get(principal_id=principal, key=key).state == "failed_retryable"


@pytest.mark.django_db
def test_inside_a_callers_transaction_the_claim_rides_a_savepoint(tenant: Tenant) -> None:
    # (Also makes pytest-django create the test database when this module runs alone:
    # `live_tenant` alone does not ask for it.)
    from idempotency.engine import Executed, IdempotentCall, StoredResponse
    from idempotency.entry import idempotency_execute
    from idempotency.selectors import IdempotencyPolicy

    call = IdempotentCall(principal_id=uid("p-"), key=uid("k-"), fingerprint="f" * 64, scope="terminal", request_id="req_nested")
    runs: list[int] = []

    def refuse(ctx: Any) -> Executed:
        runs.append(1)
        customer_row = Customer.objects.create(name=call.key)
        assert customer_row.pk
        return Executed(response=StoredResponse(status=400, headers={}, body=b"{}"))

    outcome = idempotency_execute(call=call, policy=IdempotencyPolicy(), execute=refuse)
    assert outcome.response.status == 400 and not outcome.stored
    assert customers_named(call.key) == 0 and not IdempotencyRecord.objects.filter(key=call.key).exists()

    def create(ctx: Any) -> Executed:
        runs.append(1)
        Customer.objects.create(name=call.key)
        return Executed(response=StoredResponse(status=201, headers={"Content-Type": "application/json"}, body=b'{"ok":true}'))

    assert idempotency_execute(call=call, policy=IdempotencyPolicy(), execute=create).stored
    replay = idempotency_execute(call=call, policy=IdempotencyPolicy(), execute=create)
    assert replay.replayed and replay.response.body == b'{"ok":true}' and len(runs) == 2
    assert customers_named(call.key) == 1
