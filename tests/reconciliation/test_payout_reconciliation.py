"""Reconciliation of payouts: on clean data the payouts-in-transit account holds exactly what
unfinished payouts hold and our payouts match the real simulator's; a balance edited behind
the ledger's back, a payout the PSP never made, one it made that we do not know, an amount
that differs, a payout failed here that the PSP holds as sent, and one in transit a day past
the PSP's promise are each found."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from payments.gateways.base import PayoutRequest, PayoutResult
from payments.gateways.simulator import SimulatorGateway
from payments.models import MerchantBankAccount, Payout
from payments.services.payout_saga import payout_settle, payout_submit
from payments.services.payouts import bank_account_attach, payout_create
from tests.conftest import psp_account_configure
from tests.payouts_support import fund
from tests.reconciliation.conftest import kinds, reconcile
from wallets.models import Balance
from wallets.services.principals import merchant_create, staff_member_get_or_create


def _sent(amount: int) -> Payout:
    merchant = merchant_create(name=f"Payee {uuid.uuid4().hex[:6]}")
    fund(merchant, amount, days_ago=3)
    bank_account_attach(merchant=merchant, token="btok_bank", staff=staff_member_get_or_create(username=f"ops-{uuid.uuid4().hex[:6]}"))
    MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=8))
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=amount)
    assert payout_submit(payout_id=payout.pk) == "in_transit"  # in the test's transaction: sent here, not after a commit
    return Payout.objects.get(pk=payout.pk)


def _unguarded(sql: str, params: list[Any]) -> None:
    """An edit the payout's guard (payments migration 0025) would refuse: planted data."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")


def test_payouts_reconcile_clean_and_each_difference_is_found(world: dict[str, Any], psp_simulator: Any) -> None:
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_key = psp_account_configure(psp_simulator)
    payout = _sent(3_000)
    clean = reconcile()
    assert kinds(clean) == {}, kinds(clean)
    day = timezone.now().date().isoformat()
    assert clean.report["checks"]["payouts"]["stats"][f"payouts_{day}"] == {"matched": 1}

    # The in-transit account edited behind the ledger's back.
    row = Balance.objects.filter(account__system_role="payouts_in_transit", asset_id="JPY", balance__gt=0).first()
    assert row is not None
    Balance.objects.filter(pk=row.pk).update(balance=row.balance + 1)
    assert kinds(reconcile()) == {"payouts_in_transit_mismatch": 1, "ledger_balance_mismatch": 1, "asset_not_conserved": 1}
    Balance.objects.filter(pk=row.pk).update(balance=row.balance)

    # An amount that differs, then a payout the PSP never made.
    _unguarded("UPDATE payments_payout SET amount = amount + 1 WHERE id = %s", [payout.pk])
    found = kinds(reconcile())
    assert found.pop("payout_amount_mismatch") == 1 and set(found) == {"payouts_in_transit_mismatch"}, found
    _unguarded("UPDATE payments_payout SET amount = amount - 1 WHERE id = %s", [payout.pk])
    planted = Payout.objects.create(
        merchant_id=payout.merchant_id, asset_id="JPY", amount=700, status="in_transit", gateway="simulator", destination=payout.destination,
        destination_last4="6789", psp_reference=f"po_planted_{uuid.uuid4().hex[:8]}", psp_created_at=timezone.now(),
        ledger_transaction_id=payout.ledger_transaction_id,
    )
    missing = reconcile()
    found = kinds(missing)
    assert found == {"payout_missing_at_psp": 1, "payouts_in_transit_mismatch": 1}, found  # planted without its ledger move
    assert missing.findings.get(kind="payout_missing_at_psp").details["payout"] == planted.pk
    Payout.objects.filter(pk=planted.pk).delete()

    # The PSP made a payout no payout of ours is; ours failed here while the PSP holds it as sent.
    gateway = SimulatorGateway(api_base=psp_simulator.url, secret_key=psp_key, timeout=5.0)
    stranger = gateway.payout_create(PayoutRequest(amount=10, currency="JPY", destination=payout.destination, idempotency_key="k-x",
                                                   reference=f"po_{uuid.uuid4().hex}"))
    _unguarded("UPDATE payments_payout SET status = 'failed', returned_transaction_id = ledger_transaction_id WHERE id = %s", [payout.pk])
    Payout.objects.filter(pk=payout.pk).update(psp_reference="")
    found = kinds(reconcile())
    assert found.pop("payout_unknown_at_psp") == 1 and found.pop("payout_returned_but_sent") == 1, found
    assert set(found) == {"payouts_in_transit_mismatch"}, found  # a failure planted without its ledger move
    assert stranger.psp_reference


def test_a_payout_in_transit_a_day_past_the_psps_promise_is_a_warning(world: dict[str, Any], psp_simulator: Any) -> None:
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_account_configure(psp_simulator)
    payout = _sent(500)
    Payout.objects.filter(pk=payout.pk).update(arrival_expected_at=timezone.now() - timedelta(days=2))
    run = reconcile()
    assert kinds(run) == {"payout_overdue": 1}
    finding = run.findings.get()
    assert finding.severity == "warning" and finding.details["payout"] == payout.pk


def test_money_the_psp_still_holds_on_the_way_to_a_merchants_bank_is_found(world: dict[str, Any], psp_simulator: Any) -> None:
    """At Stripe, a payout failed later leaves its money on the merchant's connected account
    until the transfer is reversed; the simulator keeps it with the bank account. While the
    payout is in transit here its failure's word may be on its way (a warning); failed here
    with the money still at the PSP, it is a finding, and the PSP's report still holds it as
    sent (the simulator keeps a failed payout not taken back in its settlement); taken back, none."""
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_key = psp_account_configure(psp_simulator)
    payout = _sent(1_000)
    assert psp_simulator.return_payout(payout.psp_reference)  # failed at the PSP, its webhook not applied yet
    assert kinds(reconcile()) == {"payout_destination_held_in_transit": 1}  # in transit here: its failure may be on its way
    # Failed here (the money back with the merchant) without the PSP giving it back: what a resolution that skipped the PSP leaves.
    _unguarded("UPDATE payments_payout SET status = 'failed', returned_transaction_id = ledger_transaction_id WHERE id = %s", [payout.pk])
    run = reconcile()
    found = kinds(run)
    assert found.get("payout_destination_not_empty") == 1 and found.get("payout_returned_but_sent") == 1, found
    finding = run.findings.get(kind="payout_destination_not_empty")
    assert (finding.details["merchant"], finding.details["amount"], finding.details["asset"]) == (payout.merchant_id, 1_000, "JPY")
    assert finding.severity == "critical" and run.findings.get(kind="payout_returned_but_sent").details["payout"] == payout.pk
    SimulatorGateway(api_base=psp_simulator.url, secret_key=psp_key, timeout=5.0).payout_return(
        reference=payout.pk, psp_reference=payout.psp_reference, destination=payout.destination, idempotency_key=f"{payout.pk}:reversal")
    found = kinds(reconcile())
    assert "payout_destination_not_empty" not in found and "payout_returned_but_sent" not in found, found


def _paid_then_failed_at_the_psp(payout: Payout, psp_simulator: Any) -> None:
    """The PSP pays the payout out (applied here), then fails it as returned by the bank: a
    `payout.failed` that never reaches us, the money left with the merchant's holding at the PSP."""
    assert payout_settle(payout_id=payout.pk, result=PayoutResult(status="paid", psp_reference=payout.psp_reference, amount=payout.amount,
                                                                  currency="JPY"), source="test") == "paid"
    assert psp_simulator.return_payout(payout.psp_reference)


def test_a_lost_failure_after_paid_is_found_even_with_a_payout_in_transit(world: dict[str, Any], psp_simulator: Any) -> None:
    """A merchant paid out every day always has a payout in transit, and may never have had one
    fail: its balance at the PSP is read all the same, and compared with what its unfinished
    payouts explain. Paid here, failed at the PSP without a word: found; a payout in transit
    explains as much as it could have brought back, and no more."""
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_account_configure(psp_simulator)
    paid = _sent(1_000)
    _paid_then_failed_at_the_psp(paid, psp_simulator)
    run = reconcile()
    assert kinds(run).get("payout_destination_not_empty") == 1, kinds(run)
    finding = run.findings.get(kind="payout_destination_not_empty")
    assert (finding.details["merchant"], finding.details["amount"], finding.details["explained"], finding.details["in_transit"]) == (
        paid.merchant_id, 1_000, 0, 0)

    # Tomorrow's payout of the same merchant, in transit: 400 cannot explain 1,000.
    fund(paid.merchant, 400, days_ago=3)
    today = payout_create(merchant=paid.merchant, asset_code="JPY", amount=400)
    assert payout_submit(payout_id=today.pk) == "in_transit"
    finding = reconcile().findings.get(kind="payout_destination_not_empty")
    assert (finding.details["amount"], finding.details["explained"], finding.details["in_transit"]) == (1_000, 0, 400)
    # One of 1,500 in transit could have failed too: a warning, its word perhaps on the way.
    fund(paid.merchant, 1_500, days_ago=3)
    larger = payout_create(merchant=paid.merchant, asset_code="JPY", amount=1_500)
    assert payout_submit(payout_id=larger.pk) == "in_transit"
    run = reconcile()
    assert "payout_destination_not_empty" not in kinds(run) and kinds(run).get("payout_destination_held_in_transit") == 1, kinds(run)
    assert run.findings.get(kind="payout_destination_held_in_transit").severity == "warning"


def test_every_merchants_balance_at_the_psp_is_read_in_turn_run_after_run(
    world: dict[str, Any], psp_simulator: Any, settings: Any
) -> None:
    """A bounded page of merchants a run, each run going on after the last one's page and round
    again: a merchant past the first page is read too."""
    settings.TALLY_RECONCILIATION_PAYOUT_DESTINATIONS = 2
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_account_configure(psp_simulator)
    payouts = [_sent(100 + i) for i in range(3)]
    merchants = sorted(p.merchant_id for p in payouts)
    last = next(p for p in payouts if p.merchant_id == merchants[-1])
    _paid_then_failed_at_the_psp(last, psp_simulator)  # only the third merchant in id order holds money it should not
    pages = []
    for _ in range(3):
        run = reconcile()
        stats = run.report["checks"]["payouts"]["stats"]
        pages.append((stats["payout_destinations_checked"], stats["payout_destinations_next"], kinds(run).get("payout_destination_not_empty")))
    assert pages == [(2, merchants[1], None), (2, merchants[0], 1), (2, merchants[2], 1)], pages


def test_payouts_waiting_too_long_for_an_operator_or_for_the_psp_are_warnings(world: dict[str, Any], psp_simulator: Any) -> None:
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_account_configure(psp_simulator)
    queued, owed, fresh = _sent(300), _sent(400), _sent(500)
    Payout.objects.filter(pk=queued.pk).update(review_at=timezone.now() - timedelta(days=2), review_reason="the PSP's payout is not ours")
    Payout.objects.filter(pk=owed.pk).update(return_owed_at=timezone.now() - timedelta(hours=2), last_error="no answer from the PSP")
    Payout.objects.filter(pk=fresh.pk).update(review_at=timezone.now() - timedelta(minutes=5))  # in the queue a moment: no finding
    run = reconcile()
    assert kinds(run) == {"payout_review_waiting": 1, "payout_return_overdue": 1}, kinds(run)
    waiting, overdue = run.findings.get(kind="payout_review_waiting"), run.findings.get(kind="payout_return_overdue")
    assert (waiting.severity, waiting.details["payout"], overdue.severity, overdue.details["payout"]) == (
        "warning", queued.pk, "warning", owed.pk)

    # The same waits as gauges, for an alert: how many, and the oldest's age; refreshed by each recovery pass.
    from prometheus_client import REGISTRY

    from payments.gateways import metrics
    from payments.services.payout_saga import payout_recovery_run, payouts_gauges_refresh

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"tenant": connection.schema_name, **labels})

    assert payouts_gauges_refresh() == {"operator_review": 2, "returns_owed": 1}
    assert sample("tally_payouts_operator_review") == 2 and sample("tally_payouts_returns_owed") == 1
    assert 2 * 86400 <= (sample("tally_payouts_waiting_oldest_seconds", queue="operator_review") or 0) < 2 * 86400 + 60
    assert 7200 <= (sample("tally_payouts_waiting_oldest_seconds", queue="return_owed") or 0) < 7200 + 60
    metrics.PAYOUTS_OPERATOR_REVIEW.labels(tenant=connection.schema_name).set(-1)
    payout_recovery_run()  # asks the PSP for the owed payout's money (in transit there: refused, so it joins the queue)
    assert sample("tally_payouts_operator_review") == Payout.objects.filter(review_at__isnull=False).count() == 3
    assert sample("tally_payouts_returns_owed") == 0 and sample("tally_payouts_waiting_oldest_seconds", queue="return_owed") == 0
