"""Metrics of the outbox relay and the merchant webhooks (exported at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

OUTBOX_LAG_SECONDS = Gauge(
    "tally_outbox_lag_seconds", "Age of the oldest unpublished, live outbox event (0: none)", ["tenant"], multiprocess_mode="max"
)
OUTBOX_EVENTS_RELAYED = Counter("tally_outbox_events_relayed_total", "Outbox events published (fanned out to deliveries)")
OUTBOX_DEAD_LETTERS = Counter("tally_outbox_dead_letters_total", "Outbox events moved to dead letters")
OUTBOX_PUBLISH_FAILURES = Counter("tally_outbox_publish_failures_total", "Outbox publications that failed (retried later)")
WEBHOOK_DELIVERIES = Counter("tally_webhook_deliveries_total", "Webhook delivery attempts by outcome (succeeded, retrying, gave_up)", ["outcome"])
WEBHOOK_FAILURES = Counter(
    "tally_webhook_failures_total", "Failed webhook attempts by reason (http_status, network, refused, unsendable)", ["reason"]
)
WEBHOOK_ENDPOINTS_DISABLED = Counter("tally_webhook_endpoints_disabled_total", "Endpoints disabled after persistent failure")
WEBHOOK_LATENCY_SECONDS = Histogram("tally_webhook_latency_seconds", "Webhook POST latency", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
