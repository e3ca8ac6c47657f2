"""Outbox lag and webhook deliveries under the HTTP payment load of bench_http.py.

    .venv/bin/python bench/bench_outbox.py --seconds 15 --clients 16 --workers 3

Seeds like bench_http.py (in its own database, tally_bench_outbox), gives every spread merchant
and the hot merchant a webhook endpoint (all events) served by a local receiver that
answers 200, then starts gunicorn, a Celery worker and Celery beat with the production
settings (loopback webhooks allowed), drives keyed terminal payments for --seconds, and
waits for the outbox and the deliveries to drain. Reports, for the events written during
the load: the lag from commit to `published_at` (p50, p99; the event's `created` stands
for its commit, which it precedes by the rest of the transaction), and deliveries per
second to the receiver (delivered rows over the span from the first to the last).
Every process it starts is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import SCHEMA, bench_env, drive, platform_start, seed, stop


class _Ok(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps connections open, as devtools/webhook_receiver.py and most servers do
    received = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with _Ok.lock:
            _Ok.received += 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def _endpoints_ensure(receiver_url: str) -> int:
    from django.db import connection
    from django_tenants.utils import schema_context

    from wallets.models import Merchant
    from webhooks.models import WebhookEndpoint
    from webhooks.services.endpoints import webhook_endpoint_create

    with schema_context(SCHEMA):
        WebhookEndpoint.objects.exclude(url=receiver_url).update(status="disabled")
        for merchant in Merchant.objects.all():
            if not WebhookEndpoint.objects.filter(merchant=merchant, url=receiver_url).exists():
                webhook_endpoint_create(merchant=merchant, url=receiver_url, enabled_events=["*"])
        WebhookEndpoint.objects.filter(url=receiver_url).update(status="enabled", disabled_reason="")
        count = WebhookEndpoint.objects.filter(url=receiver_url, status="enabled").count()
    connection.set_schema_to_public()
    return count


def _drained(since: Any) -> tuple[int, int, int]:
    """(events still unpublished, deliveries still pending, events written) since `since`."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import OutboxEvent
    from webhooks.models import WebhookDelivery

    with schema_context(SCHEMA):
        events = OutboxEvent.objects.filter(created__gte=since)
        result = (
            events.filter(published_at__isnull=True).count(),
            WebhookDelivery.objects.filter(event_created__gte=since, status="pending").count(),
            events.count(),
        )
    connection.set_schema_to_public()
    return result


def _figures(since: Any) -> dict[str, Any]:
    from django.db import connection
    from django_tenants.utils import schema_context

    with schema_context(SCHEMA), connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created)),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created)),"
            " max(extract(epoch FROM published_at - created))"
            " FROM payments_outboxevent WHERE created >= %s AND published_at IS NOT NULL",
            [since],
        )
        published, p50, p99, worst = cursor.fetchone()
        cursor.execute(
            "SELECT count(*), extract(epoch FROM max(delivered_at) - min(delivered_at)),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - event_created))"
            " FROM webhooks_webhookdelivery WHERE event_created >= %s AND status = 'succeeded'",
            [since],
        )
        delivered, span, delivery_p99 = cursor.fetchone()
    connection.set_schema_to_public()
    return {
        "events_published": published,
        "outbox_lag_p50_ms": round(float(p50 or 0) * 1000, 1),
        "outbox_lag_p99_ms": round(float(p99 or 0) * 1000, 1),
        "outbox_lag_max_ms": round(float(worst or 0) * 1000, 1),
        "deliveries_succeeded": delivered,
        "deliveries_per_s": round(delivered / float(span), 1) if span else None,
        "delivery_lag_p99_ms": round(float(delivery_p99 or 0) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3, help="gunicorn sync workers")
    parser.add_argument("--celery-concurrency", type=int, default=2)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--receiver-port", type=int, default=8767)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_outbox")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--drain-timeout", type=int, default=300)
    args = parser.parse_args()

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", args.receiver_port), _Ok)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    receiver_url = f"http://127.0.0.1:{args.receiver_port}/hooks"

    os.environ["TALLY_WEBHOOK_ALLOW_HTTP"] = os.environ["TALLY_WEBHOOK_ALLOW_LOOPBACK"] = "true"
    fixtures = seed(args.database_url, args.redis_url)
    endpoints = _endpoints_ensure(receiver_url)
    processes = platform_start(
        bench_env(args.database_url, args.redis_url), port=args.port, workers=args.workers,
        celery_concurrency=args.celery_concurrency, beat_schedule="/tmp/tally-bench-beat",
    )
    from django.utils import timezone

    result: dict[str, Any] = {"workers": args.workers, "clients": args.clients, "seconds": args.seconds, "endpoints": endpoints}
    try:
        # Start from a drained outbox: a backlog from an earlier run would be relayed first
        # (the relay goes in event order) and be counted as this run's lag.
        started = time.monotonic()
        while time.monotonic() - started < args.drain_timeout and _drained(timezone.now() - timedelta(days=3650))[:2] != (0, 0):
            time.sleep(1)
        since = timezone.now()
        result["http"] = drive(args.port, fixtures["spread"], fixtures["customers"], clients=args.clients, seconds=args.seconds)
        load_ended = time.monotonic()
        while time.monotonic() - load_ended < args.drain_timeout:
            unpublished, pending, written = _drained(since)
            if unpublished == 0 and pending == 0:
                break
            time.sleep(1)
        result["drain_seconds_after_load"] = round(time.monotonic() - load_ended, 1)
        result["events_written"], result["left_unpublished"], result["left_pending"] = written, unpublished, pending
        result.update(_figures(since))
        result["receiver_requests"] = _Ok.received
    finally:
        stop(*processes.values())
        receiver.shutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
