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

from payments.gateways.base import PayoutRequest
from payments.gateways.simulator import SimulatorGateway
from payments.models import MerchantBankAccount, Payout
from payments.services.payout_saga import payout_submit
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
    until the transfer is reversed; the simulator keeps it with the bank account. Once no
    payout of the merchant is unfinished, any such money is a finding; taken back, none."""
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_key = psp_account_configure(psp_simulator)
    payout = _sent(1_000)
    assert psp_simulator.return_payout(payout.psp_reference)  # failed at the PSP, its webhook not applied yet
    assert "payout_destination_not_empty" not in kinds(reconcile())  # in transit here: the saga's to settle
    # Failed here (the money back with the merchant) without the PSP giving it back: what a resolution that skipped the PSP leaves.
    _unguarded("UPDATE payments_payout SET status = 'failed', returned_transaction_id = ledger_transaction_id WHERE id = %s", [payout.pk])
    run = reconcile()
    assert kinds(run).get("payout_destination_not_empty") == 1, kinds(run)
    finding = run.findings.get(kind="payout_destination_not_empty")
    assert (finding.details["merchant"], finding.details["amount"], finding.details["asset"]) == (payout.merchant_id, 1_000, "JPY")
    SimulatorGateway(api_base=psp_simulator.url, secret_key=psp_key, timeout=5.0).payout_return(
        reference=payout.pk, psp_reference=payout.psp_reference, destination=payout.destination, idempotency_key=f"{payout.pk}:reversal")
    assert "payout_destination_not_empty" not in kinds(reconcile())
