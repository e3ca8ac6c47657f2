"""The request path's shortcuts keep the contracts.

The throttles' Redis call carries the replay-cache GET of a keyed POST, so the layer
does not make its own lookup; a replay served from that prefetched entry is the stored
answer byte for byte, a different body under the key is still 422, and with Redis
unreachable the request still executes (throttles fail open, the layer asks PostgreSQL).
A payment whose batch of rows fails leaves nothing, and its key executes again.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import idempotency.entry as idem_entry
from payments.models import OutboxEvent, Payment
from payments.services import charges
from payments.services.adjustments import adjustment_create
from tests.api.conftest import Api, World, error_of
from tests.conftest import TENANT_A
from wallets.models import Balance, LedgerEntry, LedgerTransaction

PAY = "/v1/terminal/payments"


@pytest.fixture
def funded(world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")


def _no_own_lookup(*_: Any, **__: Any) -> None:
    raise AssertionError("the layer made its own replay-cache lookup: the throttles' Redis call should have made it")


def test_replay_from_the_prefetched_cache_entry_is_byte_identical(api: Api, world: World, funded: None, monkeypatch: Any) -> None:
    body = {"customer": world.customer.id, "asset": "JPY", "amount": 700}
    first = api.post(PAY, world.terminal.key, body, idem="path-prefetch-1")
    assert first.status_code == 201, first.content
    second = api.post(PAY, world.terminal.key, body, idem="path-prefetch-1")  # from PostgreSQL; caches it in Redis
    assert second["Idempotent-Replayed"] == "true" and second.content == first.content
    monkeypatch.setattr(idem_entry, "replay_cache_get", _no_own_lookup)
    third = api.post(PAY, world.terminal.key, body, idem="path-prefetch-1")  # from the prefetched entry
    assert third.status_code == 201 and third["Idempotent-Replayed"] == "true"
    assert third.content == first.content
    assert third["Original-Request"] == first["Request-Id"]
    reused = api.post(PAY, world.terminal.key, {**body, "amount": 701}, idem="path-prefetch-1")
    assert reused.status_code == 422 and error_of(reused)["code"] == "idempotency_key_reused"
    assert Payment.objects.filter(amount=700).count() == 1


def test_a_fresh_key_is_looked_up_once_in_the_throttles_call(api: Api, world: World, funded: None, monkeypatch: Any) -> None:
    monkeypatch.setattr(idem_entry, "replay_cache_get", _no_own_lookup)
    r = api.post(PAY, world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 300}, idem="path-prefetch-2")
    assert r.status_code == 201, r.content
    assert "Idempotent-Replayed" not in r


def test_with_redis_unreachable_a_keyed_payment_still_executes_once(
    api: Api, world: World, funded: None, monkeypatch: Any, settings: Any
) -> None:
    import apikit.throttling as throttling
    from fastpath.replaycache import replay_cache_breaker_reset

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # refused: every fast_redis() caller falls back
    monkeypatch.setattr(throttling, "_redis_down_until", 0.0)
    body = {"customer": world.customer.id, "asset": "JPY", "amount": 500}
    try:
        first = api.post(PAY, world.terminal.key, body, idem="path-prefetch-3")
        again = api.post(PAY, world.terminal.key, body, idem="path-prefetch-3")
    finally:
        replay_cache_breaker_reset()
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert Payment.objects.filter(amount=500).count() == 1


@pytest.mark.parametrize("remembered", [False, True], ids=["plan-read", "accounts-remembered"])
def test_a_payment_whose_row_batch_fails_leaves_nothing_and_its_key_executes_again(
    api: Api, world: World, funded: None, monkeypatch: Any, remembered: bool
) -> None:
    """A payment's rows go to PostgreSQL in one batch, in their own savepoint
    (wallets.locks.rows_insert_in_savepoint). When that batch fails (here the payment id is
    taken), the failure reaches the client as a 500 in the envelope; nothing of the
    payment is left (no payment, ledger rows or event, no balance moved); and the same
    Idempotency-Key, retried, executes the payment once. With `remembered`, the parties'
    accounts are known from an earlier payment, so the batch goes before any read."""
    body = {"customer": world.customer.id, "asset": "JPY", "amount": 100}
    earlier = api.post(PAY, world.terminal.key, body)
    assert earlier.status_code == 201, earlier.content
    if not remembered:
        charges.known_accounts_forget()

    def written() -> tuple[int, ...]:
        connection.set_schema(TENANT_A["schema_name"])
        return (
            Payment.objects.count(), LedgerTransaction.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count(),
            *Balance.objects.order_by("pk").values_list("balance", flat=True),
        )

    before = written()
    taken = earlier.json()["id"]
    monkeypatch.setattr(charges.ids, "new_payment_id", lambda: taken)
    failing = Api(world.host, raise_request_exception=False)  # the 500 as the client gets it
    failed = failing.post(PAY, world.terminal.key, body, idem="path-batch-fails")
    assert failed.status_code == 500 and error_of(failed)["code"] == "internal_error", failed.content
    assert written() == before

    monkeypatch.undo()
    retried = api.post(PAY, world.terminal.key, body, idem="path-batch-fails")
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried, retried.content
    again = api.post(PAY, world.terminal.key, body, idem="path-batch-fails")
    assert again["Idempotent-Replayed"] == "true" and again.content == retried.content
    entries = LedgerEntry.objects.filter(transaction_id=Payment.objects.get(pk=taken).ledger_transaction_id).count()
    assert written()[:4] == (before[0] + 1, before[1] + 1, before[2] + entries, before[3] + 1)
