"""Metrics the ledger's transaction helpers emit (exported at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

FAIL_CLOSED = Counter("tally_fail_closed_total", "Requests refused with 503 because a store was unavailable", ["store"])
TRANSACTION_CONFLICT_RETRIES = Counter("tally_transaction_conflict_retries_total", "Conflicts retried inside a service", ["operation", "reason"])
API_KEY_EPOCH_BUMP_FAILURES = Counter(
    "tally_api_key_epoch_bump_failures_total",
    "Key revocations/rotations whose API key epoch bump Redis did not take: other processes may accept the old key until their cache TTL",
    ["tenant"],
)
