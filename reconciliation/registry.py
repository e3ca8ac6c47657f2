"""The one list of reconciliation checks and per-run metric collectors (adding a check: docs/ARCHITECTURE.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from reconciliation.checks.base import CheckContext, Discrepancy
from reconciliation.checks.ledger import conservation_check, daily_totals_check, ledger_balance_check, orphan_references_check
from reconciliation.checks.payments import (
    duplicate_charges_check,
    fee_account_check,
    idempotency_stuck_check,
    outbox_check,
    payments_run_metrics,
    payouts_check,
    psp_settlement_check,
)
from reconciliation.checks.webhooks import webhook_dead_letters_check, webhooks_run_metrics


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    run: Callable[[CheckContext], Iterable[Discrepancy]]


CHECKS: list[Check] = [
    Check("ledger_balances", "Balances (shards summed) and held amounts against the ledger entries and active holds", ledger_balance_check),
    Check("conservation", "Every ledger transaction sums to zero per asset; every asset's balances sum to zero", conservation_check),
    Check("orphan_references", "References without a database foreign key point at a row", orphan_references_check),
    Check("duplicate_charges", "Same customer, merchant and amount within 5 minutes", duplicate_charges_check),
    Check("fee_account", "The fees account per asset against the fees payments took less what refunds gave back", fee_account_check),
    Check("idempotency_stuck", "In-flight idempotency keys past their lease", idempotency_stuck_check),
    Check("outbox", "Outbox lag and dead letters", outbox_check),
    Check("webhook_deliveries", "Webhook deliveries that failed or expired (never delivered)", webhook_dead_letters_check),
    Check("daily_totals", "Every account's daily totals (once reads switched to the summary) against the sum of its entries", daily_totals_check),
    Check("psp_settlement", "Charged card top-ups against the PSP's daily settlement report; charges neither credited nor refunded",
          psp_settlement_check),
    Check("payouts", "The payouts-in-transit account against unfinished payouts; payouts against the PSP's; payouts in transit too long",
          payouts_check),
]

# Per-run metrics for the dashboard's charts, one collector per app.
METRICS: list[Callable[..., dict[str, Any]]] = [payments_run_metrics, webhooks_run_metrics]


def check_get(name: str) -> Check:
    return {check.name: check for check in CHECKS}[name]
