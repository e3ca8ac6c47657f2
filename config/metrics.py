"""The HTTP request metrics and the /metrics exposition; under gunicorn, PROMETHEUS_MULTIPROC_DIR
lets /metrics aggregate every worker's samples (prometheus-client multiprocess mode)."""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

from idempotency import metrics as _idempotency_metrics  # noqa: F401

# Each app's metrics, imported so every process exports them from its first request on.
from payments.gateways import metrics as _gateway_metrics  # noqa: F401
from wallets import metrics as _wallet_metrics  # noqa: F401
from webhooks import metrics as _webhook_metrics  # noqa: F401

REQUESTS = Counter("tally_requests_total", "HTTP requests", ["face", "method", "status"])
REQUEST_SECONDS = Histogram("tally_request_seconds", "HTTP request latency", ["face"])


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
