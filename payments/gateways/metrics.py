"""Metrics of card top-ups and the PSPs (exported at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TOPUPS_PENDING = Gauge(
    "tally_topups_pending", "Card top-ups pending (waiting for the PSP's answer or for recovery)", ["tenant"], multiprocess_mode="max"
)
TOPUP_ORPHANS_RECOVERED = Counter(
    "tally_topup_orphans_recovered_total", "Top-ups resolved by the recovery task, by outcome (succeeded, failed, unavailable)", ["outcome"]
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
