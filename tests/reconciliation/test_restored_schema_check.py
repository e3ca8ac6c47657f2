"""What refuses a restored tenant schema (`tenant_restore_staged`, reconciliation's receiver):
decided per discrepancy kind, so a check that finds both kinds (payouts: its in-transit
account against unfinished payouts, and the PSP's view) blocks on its internal one."""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone

from payments.models import Payout
from reconciliation.services import reconciliation_restored_schema_check
from tests.conftest import psp_account_configure
from tests.reconciliation.test_payout_reconciliation import _sent


def test_a_payout_planted_without_its_ledger_move_refuses_while_the_psps_view_is_a_note(world: dict[str, Any], psp_simulator: Any) -> None:
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)
    psp_account_configure(psp_simulator)
    payout = _sent(3_000)
    assert reconciliation_restored_schema_check().blocking == ()
    Payout.objects.create(
        merchant_id=payout.merchant_id, asset_id="JPY", amount=700, status="in_transit", gateway="simulator", destination=payout.destination,
        destination_last4="6789", psp_reference=f"po_planted_{uuid.uuid4().hex[:8]}", psp_created_at=timezone.now(),
        ledger_transaction_id=payout.ledger_transaction_id,
    )
    found = reconciliation_restored_schema_check()
    assert [line.split(":")[0] for line in found.blocking] == ["payouts_in_transit_mismatch"], found
    assert [line.split(":")[0] for line in found.notes] == ["payout_missing_at_psp"], found
