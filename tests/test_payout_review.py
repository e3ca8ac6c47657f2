"""A payout's money after the PSP had it, and the operator queue, against the real PSP
simulator and real PostgreSQL, committed. A payout the PSP fails after it went in transit
(even after paid) leaves the money with the merchant's holding at the PSP (as Stripe's
connected account): Tally asks the PSP to take it back, with no transaction open, and only
then credits the merchant, once; no answer leaves it owed for the recovery; a refusal stops
it for an operator with nothing given back. The PSP's payout of another amount or id (a
webhook or the recovery's answer) stops the payout too, and the recovery leaves it alone;
staff stop one the PSP never heard of. Two staff members resolve the queue: paid, or
failed with the money back once."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from devtools.psp_simulator import signature_header_for
from payments.admin import _payouts_review_panel
from payments.errors import ApproverIsMaker
from payments.gateways.base import PayoutRequest
from payments.gateways.simulator import SimulatorGateway
from payments.models import Payout
from payments.services.payout_saga import payout_recovery_run, payout_submit
from payments.services.payouts import payout_create, payout_review_resolve, payout_review_stop
from tests.payouts_support import PAYOUTS_TENANT, WEBHOOK_SECRET, World, balance, events, ledger_kinds
from wallets.errors import InvalidState
from wallets.models import AuditEntry, Merchant
from wallets.services.principals import staff_member_get_or_create


def _fresh(payout: Payout) -> Payout:
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    return Payout.objects.get(pk=payout.pk)


def _lease_runs_out() -> None:
    time.sleep(2.2)  # TALLY_PAYOUT_LEASE_SECONDS is 2 here


def _paid(world: World, amount: int) -> tuple[Any, Payout]:
    merchant = world.merchant(funds=amount)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=amount)
    world.sim.settle_payouts()
    world.webhooks_relay()
    assert _fresh(payout).status == "paid" and balance(merchant) == 0
    return merchant, _fresh(payout)


def _held_at_psp(world: World, payout: Payout) -> int:
    return world.sim.bank_balance(world.psp_key, payout.destination).get("jpy", 0)


def _bob() -> Any:
    return staff_member_get_or_create(username=f"bob-{uuid.uuid4().hex[:6]}")


def _signed_payout_event(world: World, payout: Payout, *, kind: str, **changes: Any) -> Any:
    """A payout event as the simulator signs it, of our payout's PSP payout with `changes`."""
    [psp] = world.sim.payouts(world.psp_key, reference=payout.pk)
    body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "object": "event", "type": kind, "created": int(time.time()),
                       "data": {"object": {**psp, **changes}}}).encode()
    client = Client(HTTP_HOST=PAYOUTS_TENANT["domain"])
    answer = client.post("/v1/psp/webhooks/simulator", data=body, content_type="application/json",
                         HTTP_PSP_SIGNATURE=signature_header_for(secret=WEBHOOK_SECRET, body=body, timestamp=int(time.time())))
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    return answer


# --- The money of a payout failed after the PSP had it -----------------------------------------------


def test_a_payout_failed_after_paid_is_taken_back_at_the_psp_before_the_merchant_is_credited(
    payouts_world: World, monkeypatch: Any
) -> None:
    merchant, paid = _paid(payouts_world, 2_000)
    in_transaction: list[bool] = []
    real = SimulatorGateway.payout_return

    def watched(self: SimulatorGateway, **kwargs: Any) -> None:  # the real call, its transaction state noted
        in_transaction.append(connection.in_atomic_block)
        real(self, **kwargs)

    monkeypatch.setattr(SimulatorGateway, "payout_return", watched)
    assert payouts_world.sim.return_payout(paid.psp_reference)
    assert _held_at_psp(payouts_world, paid) == 2_000  # with the merchant's holding at the PSP, not ours
    assert [a.json()["outcome"] for a in payouts_world.webhooks_relay()] == ["applied"]
    returned = _fresh(paid)
    assert in_transaction == [False]  # asked after the webhook's commit, no row locked
    assert returned.status == "failed" and returned.failure_code == "no_account" and returned.return_owed_at is None
    assert _held_at_psp(payouts_world, paid) == 0 and balance(merchant) == 2_000
    assert ledger_kinds(returned) == ["payout", "payout_paid", "payout_back"]
    assert [e[0] for e in events(returned)] == ["payout.created", "payout.paid", "payout.failed"]


def test_a_return_the_psp_does_not_answer_stays_owed_and_the_recovery_takes_it_back_once(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=1_500, token="btok_bank_returned")
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=1_500)
    payouts_world.sim.faults(fail_reversal=1)
    payouts_world.sim.settle_payouts()  # returned by the bank while in transit
    payouts_world.webhooks_relay()
    owed = _fresh(payout)
    assert owed.status == "in_transit" and owed.return_owed_at is not None and owed.return_failure_code == "no_account"
    assert balance(merchant) == 0 and _held_at_psp(payouts_world, owed) == 1_500 and "taking back" in owed.last_error
    assert payout_recovery_run().get("return_failed") is None  # tried a moment ago: it waits a lease
    _lease_runs_out()
    assert payout_recovery_run().get("return_failed") == 1
    returned = _fresh(payout)
    assert returned.status == "failed" and balance(merchant) == 1_500 and _held_at_psp(payouts_world, returned) == 0
    _lease_runs_out()
    assert not any(k.startswith("return_") for k in payout_recovery_run())  # once
    assert ledger_kinds(returned) == ["payout", "payout_back"] and balance(merchant) == 1_500


def test_a_return_the_psp_refuses_stops_for_an_operator_and_two_staff_members_resolve_it(payouts_world: World) -> None:
    merchant, paid = _paid(payouts_world, 3_000)
    payouts_world.sim.faults(refuse_reversal=1)
    assert payouts_world.sim.return_payout(paid.psp_reference)
    assert [a.json()["outcome"] for a in payouts_world.webhooks_relay()] == ["applied"]
    stopped = _fresh(paid)
    assert stopped.review_at is not None and "refused" in stopped.review_reason and stopped.status == "paid"
    assert balance(merchant) == 0 and _held_at_psp(payouts_world, stopped) == 3_000  # nothing back on its own
    assert paid.pk in str(_payouts_review_panel())  # the platform admin's tenant page lists the queue
    _lease_runs_out()
    counts = payout_recovery_run()
    assert not any(k.startswith("return_") for k in counts), counts  # the recovery leaves the queue alone
    assert _fresh(paid).psp_checked_at == stopped.psp_checked_at

    # One proposes, another confirms: Tally asks the PSP to take the money back (now it does), then credits the merchant.
    alice, bob = payouts_world.staff, _bob()
    proposed = payout_review_resolve(payout=paid, staff=alice, outcome="failed", reason="the PSP's support says try again")
    assert proposed.review_at is not None and proposed.review_outcome == "failed" and balance(merchant) == 0
    with pytest.raises(ApproverIsMaker):
        payout_review_resolve(payout=paid, staff=alice, outcome="failed", reason="again")
    payout_review_resolve(payout=paid, staff=bob, outcome="failed", reason="checked the PSP's records")
    resolved = _fresh(paid)
    assert resolved.status == "failed" and resolved.review_at is None and resolved.review_resolved_by_id == bob.pk
    assert resolved.failure_code == "no_account" and _held_at_psp(payouts_world, resolved) == 0
    assert balance(merchant) == 3_000 and ledger_kinds(resolved) == ["payout", "payout_paid", "payout_back"]
    with pytest.raises(InvalidState):
        payout_review_resolve(payout=paid, staff=bob, outcome="failed", reason="twice")
    assert balance(merchant) == 3_000
    assert list(AuditEntry.objects.filter(target_id=paid.pk, action__startswith="payout.review").order_by("id").values_list(
        "action", flat=True)) == ["payout.review_stop", "payout.review_propose", "payout.review_resolve"]


# --- The PSP's payout is not ours ---------------------------------------------------------------------


def test_a_webhook_of_another_amount_stops_the_payout_and_the_recovery_leaves_it(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=4_000)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=4_000)
    answer = _signed_payout_event(payouts_world, _fresh(payout), kind="payout.paid", status="paid", amount=4_001)
    assert answer.json()["outcome"] == "mismatch"
    stopped = _fresh(payout)
    assert stopped.status == "in_transit" and stopped.review_at is not None and "4001" in stopped.review_reason
    Payout.objects.filter(pk=payout.pk).update(arrival_expected_at=timezone.now() - timedelta(hours=1))
    counts = payout_recovery_run()
    assert not any(k.startswith("checked_") for k in counts), counts  # not asked again every beat
    assert _fresh(payout).psp_checked_at is None
    payouts_world.sim.settle_payouts()
    assert [a.json()["outcome"] for a in payouts_world.webhooks_relay()] == ["ignored"]  # the PSP's word, noted only
    assert _fresh(payout).status == "in_transit" and "the PSP says paid" in _fresh(payout).last_error
    bob = _bob()
    payout_review_resolve(payout=payout, staff=bob, outcome="paid", reason="the bank statement shows 4,000")
    done = payout_review_resolve(payout=payout, staff=payouts_world.staff, outcome="paid", reason="agreed")
    assert done.status == "paid" and done.review_at is None and ledger_kinds(done) == ["payout", "payout_paid"] and balance(merchant) == 0


def test_a_webhook_naming_another_psp_payout_stops_the_payout(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=800)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=800)
    answer = _signed_payout_event(payouts_world, _fresh(payout), kind="payout.paid", status="paid", id=f"po_{uuid.uuid4().hex[:24]}")
    assert answer.json()["outcome"] == "mismatch"
    stopped = _fresh(payout)
    assert stopped.status == "in_transit" and stopped.review_at is not None and "is not ours" in stopped.review_reason
    assert ledger_kinds(stopped) == ["payout"]


def test_a_recovery_answer_of_another_amount_stops_the_payout_once(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=2_500)
    payouts_world.sim.faults(fail_5xx=1)  # the first send never reaches the PSP
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=2_500)
    assert _fresh(payout).status == "pending" and _fresh(payout).attempts == 1
    # Past the PSP's key window the recovery looks the payout up first, and finds one of another amount under our id.
    SimulatorGateway(api_base=payouts_world.sim.url, secret_key=payouts_world.psp_key, timeout=5.0).payout_create(PayoutRequest(
        amount=2_400, currency="JPY", destination=payout.destination, idempotency_key=f"other-{uuid.uuid4().hex}", reference=payout.pk))
    Payout.objects.filter(pk=payout.pk).update(created=timezone.now() - timedelta(days=2))
    _lease_runs_out()
    assert payout_recovery_run().get("review") == 1
    stopped = _fresh(payout)
    assert stopped.status == "pending" and stopped.review_at is not None and "2400" in stopped.review_reason
    _lease_runs_out()
    assert payout_recovery_run().get("review") is None and _fresh(payout).attempts == 2  # not sent or asked again
    assert len(payouts_world.sim.payouts(payouts_world.psp_key, reference=payout.pk)) == 1


# --- Staff stop a payout the PSP cannot settle ---------------------------------------------------------


def test_staff_stop_a_payout_the_psp_never_heard_of_and_two_fail_it_with_the_money_back_once(payouts_world: World) -> None:
    merchant = payouts_world.merchant(funds=1_200)
    payouts_world.sim.faults(fail_5xx=1)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=1_200)
    Merchant.objects.filter(pk=merchant.pk).update(payouts_held=True)  # no other test's recovery sends it meanwhile
    alice, bob = payouts_world.staff, _bob()
    with pytest.raises(InvalidState):  # its send's lease is live
        payout_review_stop(payout=payout, staff=alice, reason="the PSP says it has nothing")
    _lease_runs_out()
    stopped = payout_review_stop(payout=payout, staff=alice, reason="the PSP says it has nothing")
    assert stopped.review_at is not None and "holds no payout" in stopped.review_reason and stopped.fence == 2
    _lease_runs_out()
    assert payout_recovery_run().get("in_transit") is None and payouts_world.sim.payouts(payouts_world.psp_key, reference=payout.pk) == []
    with pytest.raises(InvalidState):  # the PSP never named a payout of it
        payout_review_resolve(payout=payout, staff=bob, outcome="paid", reason="?")
    payout_review_resolve(payout=payout, staff=bob, outcome="failed", reason="never reached the PSP")
    payout_review_resolve(payout=payout, staff=alice, outcome="failed", reason="agreed")  # the PSP asked first: nothing to take back
    failed = _fresh(payout)
    assert failed.status == "failed" and failed.failure_code == "operator_failed" and balance(merchant) == 1_200
    assert [e[0] for e in events(failed)] == ["payout.created", "payout.failed"]

    # A payout the PSP holds is the saga's, and one never sent is canceled instead.
    sent = payout_create(merchant=payouts_world.merchant(funds=300), asset_code="JPY", amount=300)
    with pytest.raises(InvalidState, match="the saga settles it"):
        payout_review_stop(payout=sent, staff=alice, reason="impatient")
    assert _fresh(sent).review_at is None


def test_a_stop_whose_psp_read_raced_the_recoverys_send_is_refused(payouts_world: World, monkeypatch: Any) -> None:
    """The PSP is asked while the payout is pending and unsent; meanwhile the recovery sends it
    and the PSP answers in transit. The stop must not go ahead on the stale "the PSP holds no
    payout of it": two staff members could then fail a payout whose money is on its way."""
    merchant = payouts_world.merchant(funds=1_100)
    payouts_world.sim.faults(fail_5xx=1)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=1_100)
    # Held, so that no other test's recovery in this tenant sends it before the moment below (a stop ignores the hold).
    Merchant.objects.filter(pk=merchant.pk).update(payouts_held=True)
    _lease_runs_out()
    real = SimulatorGateway.payouts_of

    def read_then_recovery_sends(self: SimulatorGateway, **kwargs: Any) -> Any:
        found = real(self, **kwargs)  # nothing yet
        Merchant.objects.filter(pk=merchant.pk).update(payouts_held=False)
        assert payout_submit(payout_id=payout.pk) == "in_transit"  # the recovery, between the PSP's answer and the stop's lock
        return found

    monkeypatch.setattr(SimulatorGateway, "payouts_of", read_then_recovery_sends)
    with pytest.raises(InvalidState, match="moved on while the PSP was asked"):
        payout_review_stop(payout=payout, staff=payouts_world.staff, reason="the PSP says it has nothing")
    sent = _fresh(payout)
    assert sent.status == "in_transit" and sent.review_at is None and sent.psp_reference and sent.fence == 2
    assert not AuditEntry.objects.filter(target_id=payout.pk, action="payout.review_stop").exists()


def test_the_back_office_stop_asks_the_psp_outside_any_transaction_and_a_resubmission_replays(
    payouts_world: World, monkeypatch: Any
) -> None:
    from devtools.demo_seed import staff_login_ensure
    from tests.api.test_backoffice import PASSWORD, _confirm_key, q

    merchant = payouts_world.merchant(funds=900)
    payouts_world.sim.faults(fail_5xx=1)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=900)
    Merchant.objects.filter(pk=merchant.pk).update(payouts_held=True)  # no other test's recovery sends it meanwhile
    _lease_runs_out()
    in_transaction: list[bool] = []
    real = SimulatorGateway.payouts_of

    def watched(self: SimulatorGateway, **kwargs: Any) -> Any:  # the real read, its transaction state noted
        in_transaction.append(connection.in_atomic_block)
        return real(self, **kwargs)

    monkeypatch.setattr(SimulatorGateway, "payouts_of", watched)
    username = f"po-stop-{uuid.uuid4().hex[:6]}"
    staff_login_ensure(username=username, password=PASSWORD, superuser=True)
    client = Client(HTTP_HOST=PAYOUTS_TENANT["domain"], REMOTE_ADDR="203.0.113.9")
    assert client.login(username=username, password=PASSWORD)
    url = f"/admin/payments/payout/{q(payout.pk)}/act/stop/"
    form = {"idempotency_key": _confirm_key(client.get(url)), "reason": "the PSP has nothing"}
    assert client.post(url, form).status_code == 302
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    assert in_transaction == [False]  # the PSP's read ran before the confirmation's claim transaction
    stopped = _fresh(payout)
    assert stopped.review_at is not None and "holds no payout" in stopped.review_reason
    answer = client.post(url, form, follow=True)  # the same confirmation again: replayed, not refused
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    assert "Already done" in answer.content.decode() and _fresh(payout).review_at == stopped.review_at


def test_a_confirmed_failure_of_a_payout_the_psp_has_is_refused_by_the_psp_and_goes_back_to_the_queue(payouts_world: World) -> None:
    """Two staff members fail a payout the PSP holds in transit (stopped on a webhook of another
    amount): Tally asks the PSP for the money first, the PSP refuses (it is on its way to the
    bank), so nothing is credited and the payout is back in the queue, where its last
    confirmer may propose again. The PSP's next word voids a proposal made before it."""
    merchant = payouts_world.merchant(funds=2_200)
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=2_200)
    assert _signed_payout_event(payouts_world, _fresh(payout), kind="payout.paid", status="paid", amount=2_201).json()["outcome"] == "mismatch"
    alice, bob = payouts_world.staff, _bob()
    payout_review_resolve(payout=payout, staff=alice, outcome="failed", reason="looks failed")
    payout_review_resolve(payout=payout, staff=bob, outcome="failed", reason="agreed")
    back = _fresh(payout)
    assert back.status == "in_transit" and back.review_at is not None and "refused to take back" in back.review_reason
    assert balance(merchant) == 0 and ledger_kinds(back) == ["payout"] and back.returned_transaction_id is None
    assert back.review_resolved_by_id is None  # no one's checker on this stop

    # Bob confirmed the failure the PSP refused; he may propose on the new facts (no CHECK violation).
    proposed = payout_review_resolve(payout=payout, staff=bob, outcome="paid", reason="the PSP has it in transit")
    assert proposed.review_maker_id == bob.pk and proposed.review_outcome == "paid"
    payouts_world.sim.settle_payouts()
    assert [a.json()["outcome"] for a in payouts_world.webhooks_relay()] == ["ignored"]
    voided = _fresh(payout)
    assert voided.review_maker_id is None and voided.review_outcome == "" and "the PSP says paid" in voided.last_error
    assert AuditEntry.objects.filter(target_id=payout.pk, action="payout.review_proposal_void").count() == 1
    payout_review_resolve(payout=payout, staff=bob, outcome="paid", reason="the PSP says paid")
    paid = payout_review_resolve(payout=payout, staff=alice, outcome="paid", reason="agreed")
    assert paid.status == "paid" and paid.review_at is None and ledger_kinds(paid) == ["payout", "payout_paid"] and balance(merchant) == 0


def test_the_psp_saying_sent_of_a_payout_failed_here_stops_it_for_an_operator(payouts_world: World) -> None:
    """A payout declined at once is failed here, its money back with the merchant. A later
    `payout.paid` naming another PSP payout under our id is money sent twice: audited and
    queued, not dropped. One naming the very payout the PSP failed is older than its failure
    (a PSP payout never comes back from failed): nothing to do."""
    merchant = payouts_world.merchant(funds=700, token="btok_bank_declined")
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=700)
    payouts_world.webhooks_relay()
    failed = _fresh(payout)
    assert failed.status == "failed" and balance(merchant) == 700 and failed.psp_reference
    stale = _signed_payout_event(payouts_world, failed, kind="payout.paid", status="paid")
    assert stale.json()["outcome"] == "applied" and _fresh(payout).review_at is None
    other = _signed_payout_event(payouts_world, failed, kind="payout.paid", status="paid", id=f"po_{uuid.uuid4().hex[:24]}")
    assert other.json()["outcome"] == "mismatch"
    queued = _fresh(payout)
    assert queued.status == "failed" and queued.review_at is not None and "its money is back with the merchant" in queued.review_reason
    assert AuditEntry.objects.filter(target_id=payout.pk, action="payout.review_stop").exists() and balance(merchant) == 700
    alice, bob = payouts_world.staff, _bob()
    with pytest.raises(InvalidState, match="settle that with the merchant"):
        payout_review_resolve(payout=payout, staff=alice, outcome="paid", reason="the bank got it")
    payout_review_resolve(payout=payout, staff=alice, outcome="failed", reason="recovered from the merchant by an adjustment")
    payout_review_resolve(payout=payout, staff=bob, outcome="failed", reason="agreed")
    done = _fresh(payout)
    assert done.review_at is None and done.status == "failed" and balance(merchant) == 700 and ledger_kinds(done) == ["payout", "payout_back"]
