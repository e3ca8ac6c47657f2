"""What the idempotency engine's external path needed before the top-up view could use it:
`on_claim` idempotent across lease takeovers, a discarded 4xx undoing the
pending object `on_claim` wrote, final writes inside the fenced completion, a takeover of
a failed_retryable record for the recovery. Real PostgreSQL, committed rows."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotency.engine import (
    Executed,
    IdempotencyContext,
    IdempotentCall,
    StoredResponse,
    idempotency_complete_produced,
    idempotency_fail,
    idempotency_lease_takeover,
)
from idempotency.entry import Claim, _claim_external, idempotency_execute_external
from idempotency.models import IdempotencyRecord
from idempotency.selectors import IdempotencyPolicy
from payments.models import TopUp
from payments.services.topups import gateway_account_set, topup_abandon, topup_pending_ensure
from tenants.models import Tenant
from wallets.services.principals import customer_create

POLICY = IdempotencyPolicy(wait_ms=200, lease_seconds=1)


@pytest.fixture
def customer(live_tenant: Tenant) -> Iterator[Any]:
    gateway_account_set(gateway="simulator", api_base="http://127.0.0.1:9", secret_key="sk_sim_engine", webhook_secrets=["whsec_e"])
    made = customer_create(name=f"Engine {uuid.uuid4().hex[:6]}")
    yield made
    # These top-ups were never meant to be charged: keep them from a later test's recovery pass.
    TopUp.objects.filter(customer=made, status="pending").update(status="failed", failure_code="test_cleanup")


def call_for(customer: Any, key: str, request_id: str = "req_1") -> IdempotentCall:
    return IdempotentCall(principal_id=customer.pk, key=key, fingerprint="f" * 64, scope="customer", request_id=request_id,
                          method="POST", path="/v1/customer/topups")


def on_claim_for(customer: Any) -> Any:
    def on_claim(ctx: IdempotencyContext) -> None:
        topup_pending_ensure(topup_id=ctx.minted["topup"], customer=customer, asset_code="JPY", amount=100,
                             payment_method="pm_card_visa", claim_principal_id=ctx.principal_id, claim_key=str(ctx.key))
    return on_claim


def response(status: int, body: bytes = b"{}") -> StoredResponse:
    return StoredResponse(status=status, headers={"Content-Type": "application/json"}, body=body)


def test_on_claim_is_idempotent_across_a_lease_takeover(customer: Any) -> None:
    key = uuid.uuid4().hex
    first = _claim_external(call=call_for(customer, key), policy=POLICY, mint={"topup": "top"}, on_claim=on_claim_for(customer))
    assert isinstance(first, Claim)
    time.sleep(1.1)  # the holder died: its lease runs out
    second = _claim_external(call=call_for(customer, key, "req_2"), policy=POLICY, mint={"topup": "top"}, on_claim=on_claim_for(customer))
    assert isinstance(second, Claim) and second.context.fence == first.context.fence + 1
    assert second.context.minted == first.context.minted  # the same top-up id
    assert TopUp.objects.filter(customer=customer).count() == 1


def test_a_discarded_4xx_undoes_the_pending_object_of_on_claim(customer: Any) -> None:
    key = uuid.uuid4().hex

    def execute(ctx: IdempotencyContext) -> Executed:
        return Executed(response=response(400))

    outcome = idempotency_execute_external(
        call=call_for(customer, key), policy=POLICY, execute=execute, mint={"topup": "top"}, on_claim=on_claim_for(customer),
        on_release=lambda ctx: topup_abandon(topup_id=ctx.minted["topup"]),
    )
    assert outcome.response.status == 400 and not outcome.stored
    assert not IdempotencyRecord.objects.filter(principal_id=customer.pk, key=key).exists()
    topup = TopUp.objects.get(customer=customer)
    assert topup.status == "failed" and topup.failure_code == "request_invalid"  # never left pending for the recovery


def test_a_raising_on_claim_stores_nothing(customer: Any) -> None:
    key = uuid.uuid4().hex

    def bad_claim(ctx: IdempotencyContext) -> None:
        on_claim_for(customer)(ctx)
        raise ValueError("validation failed after the write")

    with pytest.raises(ValueError, match="validation"):
        idempotency_execute_external(call=call_for(customer, key), policy=POLICY, execute=lambda ctx: Executed(response=response(201)),
                                     mint={"topup": "top"}, on_claim=bad_claim)
    assert not IdempotencyRecord.objects.filter(principal_id=customer.pk, key=key).exists()
    assert not TopUp.objects.filter(customer=customer).exists()


def test_final_writes_commit_only_with_the_current_fence(customer: Any) -> None:
    key = uuid.uuid4().hex
    stale = _claim_external(call=call_for(customer, key), policy=POLICY, mint={"topup": "top"}, on_claim=on_claim_for(customer))
    assert isinstance(stale, Claim)
    time.sleep(1.1)
    current = idempotency_lease_takeover(principal_id=customer.pk, key=key, lease_seconds=30)
    assert current is not None
    writes: list[str] = []

    def produce(label: str) -> Any:
        def inner() -> Executed:
            TopUp.objects.filter(pk=current.minted["topup"]).update(failure_code=label)
            writes.append(label)
            return Executed(response=response(201, label.encode()))
        return inner

    assert idempotency_complete_produced(ctx=stale.context, call=call_for(customer, key), produce=produce("stale")) is None
    assert TopUp.objects.get(pk=current.minted["topup"]).failure_code == ""  # its write rolled back
    done = idempotency_complete_produced(ctx=current, call=call_for(customer, key), produce=produce("current"))
    assert done is not None and done.response.body == b"current"
    record = IdempotencyRecord.objects.get(principal_id=customer.pk, key=key)
    assert record.state == "completed" and bytes(record.response_body) == b"current"
    assert TopUp.objects.get(pk=current.minted["topup"]).failure_code == "current"
    # Completed: nobody completes it again, not even the current holder.
    assert idempotency_complete_produced(ctx=current, call=call_for(customer, key), produce=produce("again")) is None
    assert bytes(IdempotencyRecord.objects.get(pk=record.pk).response_body) == b"current"


def test_the_recovery_may_take_over_a_failed_retryable_record(customer: Any) -> None:
    key = uuid.uuid4().hex
    claim = _claim_external(call=call_for(customer, key), policy=POLICY, mint={"topup": "top"}, on_claim=on_claim_for(customer))
    assert isinstance(claim, Claim)
    assert idempotency_fail(record_id=claim.context.record_id or 0, fence=claim.context.fence)
    assert idempotency_lease_takeover(principal_id=customer.pk, key=key, lease_seconds=30) is None  # not without asking
    ctx = idempotency_lease_takeover(principal_id=customer.pk, key=key, lease_seconds=30, include_failed=True)
    assert ctx is not None and ctx.fence == claim.context.fence + 1 and ctx.minted == claim.context.minted
    assert IdempotencyRecord.objects.get(principal_id=customer.pk, key=key).state == "in_flight"


def test_a_late_holders_completion_is_replayed_not_reopened_by_a_waiting_takeover(customer: Any, live_tenant: Tenant) -> None:
    """The holder's lease ran out but it is completing, holding the record row. A retry
    read the record as in flight and expired, and its takeover waits on that row. When the
    holder commits (same fence), the takeover must find the record completed and replay
    it. Its compare-and-set used to match the fence only, reopening the completed record."""
    import threading

    from django.db import connection

    from idempotency.entry import Outcome
    from tests.conftest import run_in_thread_tenant

    key = uuid.uuid4().hex
    first = _claim_external(call=call_for(customer, key), policy=POLICY, mint={"topup": "top"}, on_claim=on_claim_for(customer))
    assert isinstance(first, Claim)
    time.sleep(1.1)  # the lease runs out while the holder is still at work
    holding, released = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def produce() -> Executed:
        holding.set()  # inside the completion's transaction, the record row locked
        assert released.wait(timeout=20)
        return Executed(response=response(201, b'{"late":"holder"}'))

    def holder() -> None:
        box["holder"] = run_in_thread_tenant(
            live_tenant, lambda: idempotency_complete_produced(ctx=first.context, call=call_for(customer, key), produce=produce)
        )

    def retry() -> None:
        box["retry"] = run_in_thread_tenant(
            live_tenant, lambda: _claim_external(call=call_for(customer, key, "req_2"), policy=IdempotencyPolicy(wait_ms=10_000, lease_seconds=1),
                                                   mint={"topup": "top"}, on_claim=on_claim_for(customer)),
        )

    threads = [threading.Thread(target=holder), threading.Thread(target=retry)]
    threads[0].start()
    assert holding.wait(timeout=20)
    threads[1].start()
    deadline = time.monotonic() + 20
    with connection.cursor() as cursor:  # until the retry's takeover waits on the holder's row lock
        while True:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s", ["%UPDATE%idempotency_record%"])
            if cursor.fetchone()[0] >= 1:
                break
            assert time.monotonic() < deadline, "the takeover never waited on the holder"
            time.sleep(0.05)
    released.set()
    for thread in threads:
        thread.join(timeout=30)
    assert box["holder"] is not None  # the holder completed under its fence
    retried = box["retry"]
    assert isinstance(retried, Outcome) and retried.replayed and retried.response.body == b'{"late":"holder"}', retried
    record = IdempotencyRecord.objects.get(principal_id=customer.pk, key=key)
    assert record.state == "completed" and record.fence == first.context.fence and bytes(record.response_body) == b'{"late":"holder"}'


def test_releasing_a_claim_is_one_fenced_delete(customer: Any) -> None:
    """A release must never delete a claim that a takeover has made its own: it is one
    DELETE filtered on the fence. Django's delete() sends exactly that only while nothing
    listens for the record's deletion and nothing points at it; a receiver or a foreign key
    would turn it into a read, then a delete by id, with a takeover possible in between."""
    from idempotency.engine import record_release
    from tests.conftest import statements_sent

    claim = _claim_external(call=call_for(customer, uuid.uuid4().hex), policy=POLICY, mint={"topup": "top"})
    assert isinstance(claim, Claim)
    record_id, fence = claim.context.record_id or 0, claim.context.fence
    assert record_release(record_id=record_id, fence=fence + 1) is False  # another holder's fence: kept
    sent = statements_sent(lambda: record_release(record_id=record_id, fence=fence))
    touching = [sql for sql, _ in sent if "idempotency_record" in sql]
    assert len(touching) == 1 and touching[0].lstrip().upper().startswith("DELETE") and "fence" in touching[0], touching
    assert not IdempotencyRecord.objects.filter(pk=record_id).exists()
