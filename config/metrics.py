"""Every Prometheus metric Tally exports, in one place.

Under gunicorn set PROMETHEUS_MULTIPROC_DIR so each worker writes its samples to
files that /metrics aggregates (prometheus-client multiprocess mode).
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

REQUESTS = Counter("tally_requests_total", "HTTP requests", ["face", "method", "status"])
REQUEST_SECONDS = Histogram("tally_request_seconds", "HTTP request latency", ["face"])

IDEMPOTENCY_MISSING_KEYS = Counter("tally_idempotency_missing_keys_total", "POSTs without Idempotency-Key", ["face", "mode"])
IDEMPOTENCY_REPLAYS = Counter("tally_idempotency_replays_total", "Responses replayed", ["source"])
IDEMPOTENCY_FINGERPRINT_MISMATCHES = Counter("tally_idempotency_fingerprint_mismatches_total", "Same key, different request")
IDEMPOTENCY_INFLIGHT_WAIT_SECONDS = Histogram(
    "tally_idempotency_inflight_wait_seconds", "Time a duplicate waited for the winner",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
IDEMPOTENCY_INFLIGHT_CONFLICTS = Counter("tally_idempotency_inflight_409_total", "Duplicates answered 409 after waiting")
IDEMPOTENCY_CLAIM_CONFLICTS = Counter("tally_idempotency_claim_conflicts_total", "Claims that lost a race")
IDEMPOTENCY_LEASE_TAKEOVERS = Counter("tally_idempotency_lease_takeovers_total", "Expired leases taken over")
IDEMPOTENCY_STUCK_INFLIGHT = Gauge("tally_idempotency_stuck_inflight", "In-flight records past their lease", ["tenant"], multiprocess_mode="max")
FAIL_CLOSED = Counter("tally_fail_closed_total", "Requests refused with 503 because a store was unavailable", ["store"])
TRANSACTION_CONFLICT_RETRIES = Counter("tally_transaction_conflict_retries_total", "Conflicts retried inside a service", ["operation", "reason"])
OUTBOX_LAG_SECONDS = Gauge("tally_outbox_lag_seconds", "Age of the oldest undelivered outbox event", ["tenant"], multiprocess_mode="max")
WEBHOOK_FAILURES = Counter("tally_webhook_failures_total", "Webhook delivery attempts that failed")


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
