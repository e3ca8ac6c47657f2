"""Metrics of card top-ups, payouts and the PSPs (exported at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TOPUPS_PENDING = Gauge(
    "tally_topups_pending", "Card top-ups pending (waiting for the PSP's answer or for recovery)", ["tenant"], multiprocess_mode="max"
)
TOPUPS_OPERATOR_REVIEW = Gauge(
    "tally_topups_operator_review", "Pending card top-ups waiting for an operator (past the PSP's key window)", ["tenant"],
    multiprocess_mode="max",
)
PAYOUTS_OPERATOR_REVIEW = Gauge(
    "tally_payouts_operator_review", "Payouts waiting in the operator queue for two staff members", ["tenant"], multiprocess_mode="max"
)
PAYOUTS_RETURNS_OWED = Gauge(
    "tally_payouts_returns_owed", "Payouts failed at the PSP whose money it has not given back yet (outside the operator queue)",
    ["tenant"], multiprocess_mode="max",
)
PAYOUTS_WAITING_OLDEST = Gauge(
    "tally_payouts_waiting_oldest_seconds",
    "Age of the oldest payout in the operator queue (queue=operator_review) or owing its money back (queue=return_owed); 0: none",
    ["tenant", "queue"], multiprocess_mode="max",
)
TOPUP_ORPHANS_RECOVERED = Counter(
    "tally_topup_orphans_recovered_total",
    "Pending top-ups the recovery task worked on, by outcome (succeeded, failed, unavailable, operator_review, error)",
    ["outcome"],
)
TOPUP_CARD_REFUNDS = Counter(
    "tally_topup_card_refunds_total", "Card refunds of charged, uncredited top-ups by outcome (refunded, unavailable, error)", ["outcome"]
)
TOPUP_RECOVERY_STEP_ERRORS = Counter(
    "tally_topup_recovery_step_errors_total", "Recovery steps that failed as a whole, the run going on (purge, gauges)", ["step"]
)
PSP_CALL_SECONDS = Histogram(
    "tally_psp_call_seconds", "PSP call latency", ["gateway", "operation"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
)
PSP_CALL_ERRORS = Counter(
    "tally_psp_call_errors_total", "PSP calls without a usable answer, by kind (unavailable, rejected)", ["gateway", "operation", "kind"]
)
PSP_WEBHOOKS = Counter(
    "tally_psp_webhooks_total",
    "Inbound PSP webhooks by outcome (applied, duplicate, ignored, refused_signature, refused_stale, failed)",
    ["gateway", "outcome"],
)
