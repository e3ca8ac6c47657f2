"""Metrics the idempotency layer emits (exported at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
