"""The PSP side of payouts, adapter by adapter: the simulator (devtools/psp_simulator.py, the
real process) holds bank-account tokens and makes payouts with the faults charges have
(a decline, a timeout or a 5xx after the payout was made, a payout returned later), each
answered under OUR payout id as the idempotency key and reported by a signed event; the
Stripe adapter makes a Connect transfer then a payout on the connected account, both
under keys derived from our payout id (a local stub in Stripe's shapes, no network)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from payments.gateways.base import GatewayRejected, GatewayUnavailable, PayoutRequest
from payments.gateways.signing import signature_verify
from payments.gateways.simulator import SimulatorGateway
from tests.psp_sim import Simulator
from tests.receivers import receiver_running


@pytest.fixture
def sim(psp_simulator: Simulator) -> Any:
    psp_simulator.faults_clear()
    yield psp_simulator
    psp_simulator.faults_clear()


def adapter(sim: Simulator, key: str, timeout: float = 5.0) -> SimulatorGateway:
    return SimulatorGateway(api_base=sim.url, secret_key=key, timeout=timeout)


def payout_request(destination: str, amount: int = 5000, reference: str = "") -> PayoutRequest:
    reference = reference or f"po_{uuid.uuid4().hex}"
    return PayoutRequest(amount=amount, currency="JPY", destination=destination, idempotency_key=reference, reference=reference)


def until(check: Any, seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)
    return value


# --- Simulator -----------------------------------------------------------------------------------


def test_a_bank_token_is_held_as_a_reference_and_four_digits(sim: Simulator) -> None:
    gateway = adapter(sim, f"sk_sim_{uuid.uuid4().hex}")
    bank = gateway.bank_account_attach(token="btok_bank", reference="mer_1")
    assert bank.psp_reference.startswith("ba_") and bank.last4 == "6789"
    assert gateway.bank_account_attach(token="btok_bank", reference="mer_1") == bank  # the same call again: the same account
    with pytest.raises(GatewayRejected) as refused:
        gateway.bank_account_attach(token="btok_nope", reference="mer_1")
    assert refused.value.param == "token"


def test_a_payout_goes_in_transit_then_arrives_with_a_signed_event(sim: Simulator) -> None:
    key = f"sk_sim_{uuid.uuid4().hex}"
    with receiver_running() as receiver:
        sim.webhook_endpoint(key, receiver.url(), "whsec_payouts")
        sim.faults(payout_settle_ms=100)
        gateway = adapter(sim, key)
        bank = gateway.bank_account_attach(token="btok_bank", reference="mer_1")
        request = payout_request(bank.psp_reference, amount=5000)
        first = gateway.payout_create(request)
        assert first.status == "in_transit" and first.amount == 5000 and first.currency == "JPY" and first.arrival is not None
        assert gateway.payout_create(request) == first  # our payout id is the key: one payout
        assert [p["idempotency_key"] for p in sim.payouts(key)] == [request.reference]
        received = until(lambda: [r for r in receiver.requests if b"payout.paid" in r.body])
        body = received[0].body
        signature_verify(header=received[0].headers["Psp-Signature"], body=body, secrets=["whsec_payouts"], now=time.time())
        event = gateway.event_parse(body)
        assert (event.kind, event.reference, event.psp_reference, event.amount) == ("payout_paid", request.reference, first.psp_reference, 5000)
        assert [p.status for p in gateway.payouts_of(reference=request.reference, destination=bank.psp_reference)] == ["paid"]


def test_a_declined_payout_fails_at_once_and_a_returned_one_fails_later(sim: Simulator) -> None:
    key = f"sk_sim_{uuid.uuid4().hex}"
    sim.faults(payouts_manual=True)
    gateway = adapter(sim, key)
    declined = gateway.payout_create(payout_request(gateway.bank_account_attach(token="btok_bank_declined", reference="m").psp_reference))
    assert declined.status == "failed" and declined.failure_code == "account_closed"
    returned_to = gateway.bank_account_attach(token="btok_bank_returned", reference="m2").psp_reference
    request = payout_request(returned_to)
    assert gateway.payout_create(request).status == "in_transit"
    assert sim.settle_payouts() >= 1  # the simulator's every in-transit payout, this one among them
    [late] = gateway.payouts_of(reference=request.reference, destination=returned_to)
    assert late.status == "failed" and late.failure_code == "no_account"
    # A paid payout can be returned too (days later, at a real PSP).
    paid_to = gateway.bank_account_attach(token="btok_bank", reference="m3").psp_reference
    paid = gateway.payout_create(payout_request(paid_to))
    sim.settle_payouts()
    assert sim.return_payout(paid.psp_reference)
    assert sim.payouts(key)[-1]["status"] == "failed"


@pytest.mark.parametrize("fault", ["hang_after_payout", "fail_after_payout"])
def test_a_timeout_or_a_5xx_after_the_payout_is_unknown_and_asking_again_finds_it(sim: Simulator, fault: str) -> None:
    key = f"sk_sim_{uuid.uuid4().hex}"
    gateway = adapter(sim, key, timeout=0.5)
    destination = gateway.bank_account_attach(token="btok_bank", reference="m").psp_reference
    sim.faults(**{fault: 1, "hang_seconds": 1.0})
    request = payout_request(destination)
    with pytest.raises(GatewayUnavailable):
        gateway.payout_create(request)
    assert len(sim.payouts(key)) == 1  # made, unheard
    again = gateway.payout_create(request)
    assert again.status == "in_transit" and [p["id"] for p in sim.payouts(key)] == [again.psp_reference]


def test_a_5xx_before_anything_is_unknown_and_a_bad_destination_is_refused(sim: Simulator) -> None:
    key = f"sk_sim_{uuid.uuid4().hex}"
    gateway = adapter(sim, key)
    sim.faults(fail_5xx=1)
    with pytest.raises(GatewayUnavailable):
        gateway.payout_create(payout_request("ba_missing"))
    with pytest.raises(GatewayRejected) as refused:
        gateway.payout_create(payout_request("ba_missing"))
    assert refused.value.param == "destination" and sim.payouts(key) == []


def test_the_settlement_report_lists_the_days_payouts(sim: Simulator) -> None:
    key = f"sk_sim_{uuid.uuid4().hex}"
    sim.faults(payouts_manual=True)
    gateway = adapter(sim, key)
    made = gateway.payout_create(payout_request(gateway.bank_account_attach(token="btok_bank", reference="m").psp_reference, amount=700))
    gateway.payout_create(payout_request(gateway.bank_account_attach(token="btok_bank_declined", reference="n").psp_reference))
    report = gateway.settlement_report(day=datetime.now(UTC).date())
    assert [(line.kind, line.psp_reference, line.amount) for line in report.lines] == [("payout", made.psp_reference, -700)]


def test_a_payout_failed_later_leaves_its_money_with_the_bank_account_until_it_is_taken_back(sim: Simulator) -> None:
    """As at Stripe (the connected account): the reversal takes it back once, under its key;
    refused or unanswered, it stays; a payout that has not failed is refused."""
    key = f"sk_sim_{uuid.uuid4().hex}"
    sim.faults(payouts_manual=True)
    gateway = adapter(sim, key)
    bank = gateway.bank_account_attach(token="btok_bank", reference="m").psp_reference
    request = payout_request(bank, amount=900)
    made = gateway.payout_create(request)
    with pytest.raises(GatewayRejected) as early:
        gateway.payout_return(reference=request.reference, psp_reference=made.psp_reference, destination=bank, idempotency_key="k1")
    assert early.value.code == "payout_not_failed"
    sim.settle_payouts()
    assert sim.return_payout(made.psp_reference)
    assert gateway.destination_balance(destination=bank) == {"JPY": 900}
    sim.faults(refuse_reversal=1)
    with pytest.raises(GatewayRejected) as refused:
        gateway.payout_return(reference=request.reference, psp_reference=made.psp_reference, destination=bank, idempotency_key="k1")
    assert refused.value.code == "insufficient_funds"
    sim.faults(fail_reversal=1)
    with pytest.raises(GatewayUnavailable):
        gateway.payout_return(reference=request.reference, psp_reference=made.psp_reference, destination=bank, idempotency_key="k1")
    assert gateway.destination_balance(destination=bank) == {"JPY": 900}
    for _ in range(2):  # the same key again: the first answer
        gateway.payout_return(reference=request.reference, psp_reference=made.psp_reference, destination=bank, idempotency_key="k1")
    gateway.payout_return(reference=request.reference, psp_reference=made.psp_reference, destination=bank, idempotency_key="k2")
    assert gateway.destination_balance(destination=bank) == {"JPY": 0}  # taken back once
    declined_to = gateway.bank_account_attach(token="btok_bank_declined", reference="n").psp_reference
    declined = gateway.payout_create(payout_request(declined_to))
    gateway.payout_return(reference="x", psp_reference=declined.psp_reference, destination=declined_to, idempotency_key="k3")
    assert gateway.destination_balance(destination=declined_to) == {}  # declined at once: nothing had left
