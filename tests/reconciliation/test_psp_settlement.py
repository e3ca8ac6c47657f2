"""Reconciliation against the PSP: our charged card top-ups match the
real simulator's daily settlement report on clean data (`topup_settlement_compare`, and
the check around it); a line of ours the PSP never settled, and a PSP charge we have no
record of, are each found."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from django.test import Client
from django.utils import timezone

from payments.models import TopUp, TopUpStatus
from reconciliation.checks.payments import topup_settlement_compare
from tenants.models import Tenant
from tests.conftest import TENANT_B, in_tenant, psp_account_configure
from tests.psp_sim import Simulator
from tests.reconciliation.conftest import RECON_TENANT, kinds, reconcile
from wallets.services.principals import api_key_create, customer_create


def _card_topup(customer: Any, amount: int) -> TopUp:
    _, key = api_key_create(principal=customer)
    response = Client(HTTP_HOST=RECON_TENANT["domain"]).post(
        "/v1/customer/topups", json.dumps({"asset": "JPY", "amount": amount, "payment_method": "pm_card_visa"}),
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex,
    )
    assert response.status_code == 201, response.content
    return TopUp.objects.get(pk=response.json()["id"])


def test_psp_settlement_matches_and_finds_what_is_missing(world: dict[str, Any], psp_simulator: Any) -> None:
    psp_account_configure(psp_simulator)
    real = _card_topup(world["alice"], 3_000)
    assert real.status == TopUpStatus.SUCCEEDED and real.psp_reference

    clean = reconcile()
    assert kinds(clean) == {}, kinds(clean)
    day = timezone.now().date().isoformat()
    assert clean.report["checks"]["psp_settlement"]["stats"][f"psp_settlement_{day}"] == {"matched": 1, "ours": 3_000, "psp": 3_000}

    # A top-up of ours, credited as charged, that the PSP never charged.
    planted = TopUp.objects.create(
        customer=world["bob"], asset_id="JPY", amount=700, payment_method="pm_card_visa", status=TopUpStatus.SUCCEEDED,
        ledger_transaction=real.ledger_transaction, psp_reference=f"ch_planted_{uuid.uuid4().hex[:8]}", psp_charged_at=timezone.now(),
        psp_charged=True, gateway="simulator",
    )
    missing = reconcile()
    assert kinds(missing) == {"psp_settlement_missing_line": 1}
    finding = missing.findings.get()
    assert finding.details["topup"] == planted.pk and finding.refs == [{"app_label": "payments", "model": "topup", "pk": planted.pk}]

    # The PSP settled a charge that no top-up of ours records.
    TopUp.objects.filter(pk=planted.pk).delete()
    TopUp.objects.filter(pk=real.pk).update(psp_reference="", psp_charged=False)
    unknown = reconcile()
    assert kinds(unknown) == {"psp_settlement_unknown_charge": 1}
    assert unknown.findings.get().details["psp_reference"] == real.psp_reference


def test_a_charge_neither_credited_nor_refunded_is_a_finding(world: dict[str, Any]) -> None:
    """A top-up the PSP charged that failed without a credit, and whose card refund is still
    not recorded a recovery window later, whatever its failure code. A refunded one, and one
    the recovery has not had its window for yet, are not findings."""
    from datetime import timedelta

    long_ago = timezone.now() - timedelta(hours=2)

    def charged_failed(code: str, **fields: Any) -> TopUp:
        return TopUp.objects.create(
            customer=world["bob"], asset_id="JPY", amount=600, payment_method="pm_card_visa", gateway="simulator",
            status=TopUpStatus.FAILED, failure_code=code, psp_reference=f"ch_{uuid.uuid4().hex[:12]}", psp_charged=True,
            psp_charged_at=long_ago, **fields,
        )

    owed = charged_failed("request_invalid")
    refunded = charged_failed("cap_exceeded", psp_refund_reference="re_done")
    charged_failed("wallet_frozen")  # failed just now: the recovery's window is still open
    TopUp.objects.filter(pk__in=[owed.pk, refunded.pk]).update(updated=long_ago)

    run = reconcile()
    assert kinds(run) == {"psp_settlement_charged_uncredited": 1}, kinds(run)
    finding = run.findings.get()
    assert finding.severity == "critical" and finding.details["topup"] == owed.pk and finding.details["failure_code"] == "request_invalid"
    assert {"app_label": "payments", "model": "topup", "pk": owed.pk} in finding.refs


def test_the_psps_daily_settlement_report_matches_our_top_ups(live_tenant: Tenant, tenant_b: Tenant, psp_simulator: Simulator) -> None:
    # Tenant B: its only card top-ups are this test's (tenant A's account changes key per test).
    with in_tenant(tenant_b):
        psp_key = psp_account_configure(psp_simulator)
        customer = customer_create(name=f"Settle {uuid.uuid4().hex[:8]}")
        key = api_key_create(principal=customer)[1]
        client = Client(HTTP_HOST=TENANT_B["domain"])

        def post(body: dict[str, Any]) -> int:
            return client.post("/v1/customer/topups", data=json.dumps(body), content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex).status_code

        assert post({"asset": "EUR", "amount": 300, "payment_method": "pm_card_visa"}) == 201
        assert post({"asset": "EUR", "amount": 450, "payment_method": "pm_card_mastercard"}) == 201
        assert post({"asset": "EUR", "amount": 99, "payment_method": "pm_card_declined"}) == 402
        day = datetime.now(UTC).date()
        comparison = topup_settlement_compare(day=day)
        assert comparison.balanced, comparison
        assert comparison.matched == 2 and comparison.ours_total == comparison.psp_total == 750
        report = psp_simulator.settlement(psp_key, day.isoformat())
        assert report["totals"] == {"eur": 750}
        ours = {t.psp_reference for t in TopUp.objects.filter(customer=customer, status="succeeded")}
        assert {line["id"] for line in report["lines"]} == ours
        # A charge the PSP settled that we have no top-up for is reported, not hidden.
        TopUp.objects.filter(customer=customer, amount=300).update(psp_reference="ch_not_ours")
        broken = topup_settlement_compare(day=day)
        assert not broken.balanced and len(broken.missing_here) == 1 and len(broken.missing_at_psp) == 1


def test_a_psp_that_does_not_answer_is_one_warning_a_day_and_the_run_goes_on(world: dict[str, Any]) -> None:
    """The gateway's own error (no answer on its port) is a warning for each compared day, for
    top-ups and for payouts, and the ledger checks still report: the run never ends in an
    exception."""
    from payments.services.topups import gateway_account_set
    from tests.receivers import free_port

    gateway_account_set(gateway="simulator", api_base=f"http://127.0.0.1:{free_port()}", secret_key="sk_sim_nobody", webhook_secrets=["whsec_x"])
    run = reconcile()
    found = kinds(run)
    assert set(found) == {"psp_settlement_unavailable", "payout_settlement_unavailable"}, found
    assert found["psp_settlement_unavailable"] == found["payout_settlement_unavailable"] == 2, found  # the last two UTC days
    assert {f.severity for f in run.findings.all()} == {"warning"}
    assert run.report["checks"]["ledger_balances"]["findings"] == 0
