"""The one list of reconciliation checks, and the checks on webhooks' own data.

Each check is registered once, below, with its name: a function `(ctx) -> Iterator[Discrepancy]`
that streams (see wallets.reconciliation for the contract). Each layer contributes the
checks on its own tables (wallets: ledger, balances, conservation, orphaned references;
payments: duplicate charges, idempotency, outbox); this layer, the only one that sees
them all, lists them and adds the webhook deliveries'.

Adding a check: write it next to its data (as `payments/reconciliation.py` holds the check
of our card top-ups against the PSP's settlement report) and append one `Check(...)` to
`CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Count

from payments.reconciliation import (
    duplicate_charges_check,
    idempotency_stuck_check,
    outbox_check,
    payments_run_metrics,
    psp_settlement_check,
)
from wallets.reconciliation import (
    CheckContext,
    Discrepancy,
    ObjectRef,
    Severity,
    conservation_check,
    ledger_balance_check,
    merchant_daily_totals_check,
    orphan_references_check,
)
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus


def webhook_dead_letters_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Webhook deliveries that failed for their whole retry window (redeliverable from the admin)."""
    failed = WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.FAILED).select_related("endpoint").order_by("created", "id")
    for delivery in failed.iterator(chunk_size=ctx.chunk_size):
        yield Discrepancy(
            kind="webhook_dead_letter",
            severity=Severity.WARNING,
            summary=f"delivery {delivery.id} of {delivery.event_id} ({delivery.topic}) to {delivery.endpoint.url} failed after "
            f"{delivery.attempts} attempts: {delivery.last_status_code or delivery.last_error[:120]}",
            details={"delivery": delivery.id, "event": delivery.event_id, "topic": delivery.topic, "endpoint": delivery.endpoint_id,
                     "merchant": delivery.endpoint.merchant_id, "url": delivery.endpoint.url, "attempts": delivery.attempts,
                     "last_status_code": delivery.last_status_code, "last_error": delivery.last_error,
                     "give_up_at": delivery.give_up_at.isoformat()},
            refs=(ObjectRef("webhooks", "webhookdelivery", delivery.id), ObjectRef("webhooks", "webhookendpoint", delivery.endpoint_id),
                  ObjectRef("payments", "outboxevent", delivery.event_id)),
        )


def webhooks_run_metrics(*, ctx: CheckContext) -> dict[str, Any]:
    counts = dict(WebhookDelivery.objects.order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    return {"webhook_pending": int(counts.get(WebhookDeliveryStatus.PENDING, 0)), "webhook_failed": int(counts.get(WebhookDeliveryStatus.FAILED, 0))}


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
    Check("idempotency_stuck", "In-flight idempotency keys past their lease", idempotency_stuck_check),
    Check("outbox", "Outbox lag and dead letters", outbox_check),
    Check("webhook_deliveries", "Webhook deliveries that failed for good", webhook_dead_letters_check),
    Check("merchant_daily_totals", "Merchant daily totals (once reads switched to the summary) against the ledger", merchant_daily_totals_check),
    Check("psp_settlement", "Charged card top-ups against the PSP's daily settlement report; charges neither credited nor refunded",
          psp_settlement_check),
]

# Per-run metrics for the dashboard's charts, one collector per layer.
METRICS: list[Callable[..., dict[str, Any]]] = [payments_run_metrics, webhooks_run_metrics]


def check_get(name: str) -> Check:
    for check in CHECKS:
        if check.name == name:
            return check
    raise KeyError(name)
