"""Reconciliation against the PSP: our charged card top-ups match the
real simulator's daily settlement report on clean data; a line of ours the PSP never
settled, and a PSP charge we have no record of, are each found."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.test import Client
from django.utils import timezone

from payments.models import TopUp, TopUpStatus
from tests.conftest import psp_account_configure
from tests.reconciliation.conftest import RECON_TENANT, kinds, reconcile
from wallets.services.principals import api_key_create


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
