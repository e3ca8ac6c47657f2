"""The payout saga against the real PSP simulator and real PostgreSQL, committed: a payout
moves the merchant's available money to payouts in transit with its row and event, is
sent under its own id, and ends paid (in transit -> PSP settlement) or failed (back to
the merchant, once: declined at once, returned later, returned after paid); a timeout or
a 5xx after the PSP made it converges to one payout; a holder whose lease was taken over
cannot overwrite; duplicate webhooks apply once; a payout in transit whose webhook is
lost is settled by asking the PSP; a lost send is found through the due-work row."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from payments.errors import PayoutNotCancelable
from payments.models import Payout, PspWebhookEvent
from payments.services import payout_saga
from payments.services.payout_saga import payout_recovery_run, payout_submit
from payments.services.payouts import payout_cancel, payout_create
from payments.tasks import topups_recover_due_tenants
from tenants.models import DueWork, DueWorkKind
from tests.conftest import run_in_thread_tenant
from tests.payouts_support import (
    PAYOUTS_TENANT,
    World,
    balance,
    events,
    ledger_kinds,
    system_balance,
)
from wallets.models import SystemRole


def _fresh(payout: Payout) -> Payout:
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    return Payout.objects.get(pk=payout.pk)


def _lease_runs_out() -> None:
    time.sleep(2.2)  # TALLY_PAYOUT_LEASE_SECONDS is 2 here


def test_a_payout_goes_in_transit_under_its_id_then_paid_once_by_its_webhook(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=10_000)
    in_transit, psp = system_balance(SystemRole.PAYOUTS_IN_TRANSIT), system_balance(SystemRole.PSP_FUNDING)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=6_000)
    assert payout.pk.startswith("po_") and balance(merchant) == 4_000
    sent = _fresh(payout)  # sent after the commit (the task runs eagerly here)
    assert sent.status == "in_transit" and sent.fence == 1 and sent.attempts == 1 and sent.lease_expires_at is None
    assert [p["idempotency_key"] for p in payouts_world.sim.payouts(payouts_world.psp_key)] == [payout.pk]
    assert sent.psp_reference and sent.arrival_expected_at is not None
    assert system_balance(SystemRole.PAYOUTS_IN_TRANSIT) == in_transit + 6_000

    assert payouts_world.sim.settle_payouts() >= 1
    answers = payouts_world.webhooks_relay()
    assert [a.json()["outcome"] for a in answers] == ["applied"]
    paid = _fresh(payout)
    assert paid.status == "paid" and paid.paid_transaction_id and paid.settled_at
    assert ledger_kinds(paid) == ["payout", "payout_paid"]
    assert system_balance(SystemRole.PAYOUTS_IN_TRANSIT) == in_transit and system_balance(SystemRole.PSP_FUNDING) == psp + 6_000
    assert events(paid) == [("payout.created", 1, "pending"), ("payout.paid", 2, "paid")]
    assert balance(merchant) == 4_000


def test_a_declined_payout_fails_at_once_and_the_money_comes_back_once(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=5_000, token="btok_bank_declined")
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=5_000)
    failed = _fresh(payout)
    assert failed.status == "failed" and failed.failure_code == "account_closed" and balance(merchant) == 5_000
    payouts_world.webhooks_relay()  # the PSP's payout.failed too: nothing more moves
    assert ledger_kinds(_fresh(payout)) == ["payout", "payout_back"] and balance(merchant) == 5_000
    assert events(failed) == [("payout.created", 1, "pending"), ("payout.failed", 2, "failed")]


def test_a_payout_returned_in_transit_or_after_paid_comes_back_once(payouts_world: World) -> None:
    returning = payouts_world.merchant(funds=3_000, token="btok_bank_returned")
    in_transit = payout_create(merchant=returning, asset_code="JPY", amount=3_000)
    payouts_world.sim.settle_payouts()
    payouts_world.webhooks_relay()
    assert _fresh(in_transit).status == "failed" and _fresh(in_transit).failure_code == "no_account" and balance(returning) == 3_000

    merchant = payouts_world.merchant(funds=2_000)
    psp = system_balance(SystemRole.PSP_FUNDING)
    paid = payout_create(merchant=merchant, asset_code="JPY", amount=2_000)
    payouts_world.sim.settle_payouts()
    payouts_world.webhooks_relay()
    assert _fresh(paid).status == "paid" and balance(merchant) == 0
    assert payouts_world.sim.return_payout(_fresh(paid).psp_reference)  # days later, at a real PSP
    payouts_world.webhooks_relay()
    returned = _fresh(paid)
    assert returned.status == "failed" and ledger_kinds(returned) == ["payout", "payout_paid", "payout_back"]
    assert balance(merchant) == 2_000 and system_balance(SystemRole.PSP_FUNDING) == psp
    assert [e[0] for e in events(returned)] == ["payout.created", "payout.paid", "payout.failed"]


@pytest.mark.parametrize("fault", ["hang_after_payout", "fail_after_payout"])
def test_a_timeout_or_5xx_after_the_psp_made_it_converges_to_one_payout(payouts_world: World, fault: str) -> None:
    merchant = payouts_world.merchant(funds=4_000)
    payouts_world.sim.faults(**{fault: 1, "hang_seconds": 1.5})
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=4_000)
    unknown = _fresh(payout)
    assert unknown.status == "pending" and unknown.attempts == 1 and unknown.last_error
    assert len(payouts_world.sim.payouts(payouts_world.psp_key)) == 1  # made at the PSP, unheard here
    with pytest.raises(PayoutNotCancelable):  # the PSP may have it
        payout_cancel(payout=unknown)
    assert payout_submit(payout_id=payout.pk) == "skipped"  # its lease is live
    _lease_runs_out()
    assert payout_recovery_run().get("in_transit") == 1
    recovered = _fresh(payout)
    assert recovered.status == "in_transit" and recovered.fence == 2 and recovered.attempts == 2
    assert [p["id"] for p in payouts_world.sim.payouts(payouts_world.psp_key)] == [recovered.psp_reference]
    assert ledger_kinds(recovered) == ["payout"] and balance(merchant) == 0


def test_a_stalled_holder_wakes_after_a_takeover_and_cannot_overwrite(payouts_world: World, settings: Any, monkeypatch: Any) -> None:
    merchant = payouts_world.merchant(funds=1_500)
    payouts_world.sim.faults(payouts_manual=True, hang_after_payout=0)
    paused, released = threading.Event(), threading.Event()

    def pause(_seconds: float) -> None:
        paused.set()
        released.wait(timeout=60)

    settings.TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS = 1.0
    monkeypatch.setattr(payout_saga, "time", SimpleNamespace(sleep=pause, monotonic=time.monotonic))
    payout = Payout.objects.none()
    box: dict[str, Any] = {}

    def first() -> None:
        made = payout_create(merchant=merchant, asset_code="JPY", amount=1_500)  # its send stalls after the PSP's answer
        box["payout"] = made

    tenant = payouts_tenant_of()
    stalled = threading.Thread(target=lambda: run_in_thread_tenant(tenant, first), daemon=True)
    stalled.start()
    assert paused.wait(20)
    settings.TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS = 0.0
    payout = Payout.objects.get(merchant=merchant)
    assert payout.status == "pending" and payout.fence == 1
    _lease_runs_out()
    assert payout_submit(payout_id=payout.pk) == "in_transit"  # the takeover: fence 2, the PSP's first payout again
    payouts_world.sim.settle_payouts()
    payouts_world.webhooks_relay()
    settled = _fresh(payout)
    assert settled.status == "paid" and settled.fence == 2
    released.set()
    stalled.join(timeout=30)
    assert not stalled.is_alive()
    after = _fresh(payout)
    assert (after.status, after.fence, after.updated) == ("paid", 2, settled.updated)  # the stalled holder wrote nothing
    assert len(payouts_world.sim.payouts(payouts_world.psp_key)) == 1 and ledger_kinds(after) == ["payout", "payout_paid"]


def payouts_tenant_of() -> Any:
    from tenants.models import Tenant

    return Tenant.objects.get(schema_name=PAYOUTS_TENANT["schema_name"])


def test_duplicate_webhooks_apply_once(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=900)
    payouts_world.sim.faults(duplicate_webhooks=True)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=900)
    payouts_world.sim.settle_payouts()
    outcomes = sorted(a.json()["outcome"] for a in payouts_world.webhooks_relay(expect=2))
    assert outcomes == ["applied", "duplicate"]
    assert ledger_kinds(_fresh(payout)) == ["payout", "payout_paid"]
    assert PspWebhookEvent.objects.filter(type="payout.paid", outcome="applied").count() >= 1


def test_a_payout_whose_webhook_is_lost_is_settled_by_asking_the_psp(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=700)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=700)
    payouts_world.sim.settle_payouts()  # paid at the PSP; its webhook never relayed
    assert payout_recovery_run().get("checked_paid") is None  # not past the PSP's promise yet
    Payout.objects.filter(pk=payout.pk).update(arrival_expected_at=timezone.now() - timedelta(minutes=1))
    assert payout_recovery_run().get("checked_paid") == 1
    assert _fresh(payout).status == "paid" and _fresh(payout).psp_checked_at is not None
    assert payout_recovery_run().get("checked_paid") is None  # asked once an interval


def test_cancel_only_before_the_psp_has_it(payouts_world: World) -> None:
    from wallets.models import Asset

    merchant = payouts_world.merchant(funds=8_000)
    Asset.objects.filter(code="JPY").update(payout_approval_threshold=5_000)
    try:
        waiting = payout_create(merchant=merchant, asset_code="JPY", amount=6_000)
    finally:
        Asset.objects.filter(code="JPY").update(payout_approval_threshold=None)
    assert _fresh(waiting).status == "pending" and _fresh(waiting).attempts == 0 and balance(merchant) == 2_000
    assert payout_submit(payout_id=waiting.pk) == "skipped"  # waits for a staff member
    canceled = payout_cancel(payout=waiting, reason="asked by the merchant")
    assert canceled.status == "canceled" and balance(merchant) == 8_000 and ledger_kinds(canceled) == ["payout", "payout_back"]
    with pytest.raises(PayoutNotCancelable):
        payout_cancel(payout=canceled)
    assert payouts_world.sim.payouts(payouts_world.psp_key) == []
    assert [e[0] for e in events(canceled)] == ["payout.created", "payout.canceled"]


def test_a_lost_send_marks_the_tenant_and_beats_due_task_alone_sends_it(payouts_world: World, monkeypatch: Any) -> None:
    merchant = payouts_world.merchant(funds=1_200)
    DueWork.objects.filter(tenant_id=PAYOUTS_TENANT["schema_name"]).delete()
    monkeypatch.setattr(payout_saga, "payout_submit_on_commit", lambda **kwargs: None)
    from payments.services import payouts

    monkeypatch.setattr(payouts, "payout_submit_on_commit", lambda **kwargs: None)  # the broker lost the send
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=1_200)
    assert _fresh(payout).attempts == 0
    due = DueWork.objects.get(tenant_id=PAYOUTS_TENANT["schema_name"], kind=DueWorkKind.TOPUPS)
    assert due.due_at > timezone.now()  # the lease's length: the send had its chance first
    DueWork.objects.filter(pk=due.pk).update(due_at=timezone.now())
    _lease_runs_out()
    topups_recover_due_tenants.apply()
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    assert _fresh(payout).status == "in_transit"


def test_a_payout_backlog_shares_the_recovery_tasks_budget_and_is_left_due(payouts_world: World, settings: Any) -> None:
    """The recovery task's payout pass is one loop of the pass's one budget: with 12 sends
    lost while the PSP was down and a PSP that now takes 0.4 s a payout, a task whose pass
    has 1.5 s (each loop 1 s) returns well inside a 4 s soft limit having sent some, the
    top-up pass given only what was left; the rest stays due now, and the next passes send
    it. The payout pass used to take 25 s of its own, then the top-up pass its whole budget."""
    from django.core.cache import cache

    from payments.tasks import topups_recover_tenant
    from tests.test_card_topups import _celery_time_limits

    merchant = payouts_world.merchant(funds=12_000)
    payouts_world.sim.faults(fail_5xx=1_000)  # each send answered 500: pending, the recovery's
    made = {payout_create(merchant=merchant, asset_code="JPY", amount=1_000).pk for _ in range(12)}
    payouts_world.sim.faults(fail_5xx=0, latency_ms=400)
    assert Payout.objects.filter(pk__in=made, status="pending").count() == 12
    _lease_runs_out()
    settings.TALLY_TOPUP_RECOVERY_LOOP_SECONDS = 1.0
    settings.TALLY_TOPUP_RECOVERY_PASS_SECONDS = 1.5
    schema = connection.schema_name
    try:
        DueWork.objects.filter(tenant_id=schema).delete()
        started = time.monotonic()
        with _celery_time_limits(soft=4.0, hard=6.0):
            counts = topups_recover_tenant()
        assert time.monotonic() - started < 4.0, counts
        sent = Payout.objects.filter(pk__in=made, status="in_transit").count()
        assert 1 <= sent < 12 and counts["payouts_budget_exhausted"] == 1, counts
        assert DueWork.objects.filter(tenant_id=schema, kind=DueWorkKind.TOPUPS, due_at__lte=timezone.now()).exists()
        for _ in range(12):  # the next passes go on with the rest
            if sent == 12:
                break
            topups_recover_tenant()
            sent = Payout.objects.filter(pk__in=made, status="in_transit").count()
        assert sent == 12
    finally:
        cache.delete_many([f"topups:recovery:resume:{loop}" for loop in ("refunds", "pending")])
