"""Metrics the ledger's transaction helpers emit (exported at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

FAIL_CLOSED = Counter("tally_fail_closed_total", "Requests refused with 503 because a store was unavailable", ["store"])
TRANSACTION_CONFLICT_RETRIES = Counter("tally_transaction_conflict_retries_total", "Conflicts retried inside a service", ["operation", "reason"])
