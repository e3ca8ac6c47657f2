"""What the Celery worker spends per payment event: the outbox relay and its webhook
delivery, measured in one process.

    .venv/bin/python bench/bench_relay_cpu.py --events 1000                 # spread and hot, 5 events per run
    .venv/bin/python bench/bench_relay_cpu.py --events 1000 --per-run 100   # a backlog
    .venv/bin/python bench/bench_relay_cpu.py --events 1000 --cprofile 30   # + top functions

Seeds its own database (default tally_bench_relay) the way bench/bench_http.py does, gives
every merchant an endpoint for all events served by a receiver in another process (it
answers 200; its CPU is not counted), writes --events committed `payment.succeeded`
events, then runs the relay (`outbox_relay_run`, what the "webhooks.outbox_relay" task
runs) in this process, --per-run events at a time (under load a relay run finds the few
events committed since the last one), until everything is published and delivered.
Two shapes:
- spread: each event's merchant is a different one, so each delivery is its own
  endpoint's only one (bench_outbox.py's load);
- hot: every event goes to one merchant's endpoint (`make run`'s demo merchant).

Reports per event: Python CPU (`time.process_time`, this process only), the CPU of its
PostgreSQL backend (from /proc), wall time, SQL statements and relay runs. Under `make
run` this work shares the two cores with the web workers, so each millisecond here is one
the payments do not get.
"""

from __future__ import annotations

import argparse
import cProfile
import http.server
import io
import json
import multiprocessing
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_http import SCHEMA, seed  # noqa: E402
from bench.bench_outbox import _Ok  # noqa: E402  # the receiver that answers 200
from bench.bench_request_cpu import _prepared_count  # noqa: E402
from bench.cpu_by_process import cpu_ms  # noqa: E402


def _serve(port: int) -> None:
    http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ok).serve_forever()


def _events_write(merchant_ids: list[str], count: int) -> None:
    from payments.services.outbox import outbox_event_create
    from wallets.transactions import run_atomic

    def write() -> None:
        for n in range(count):
            merchant = merchant_ids[n % len(merchant_ids)]
            outbox_event_create(
                topic="payment.succeeded",
                payload={"id": f"pay_bench{n}", "object": "payment", "merchant": merchant, "amount": 1, "asset": "JPY"},
            )

    run_atomic(write, operation="bench_events")


def _measure(shape: str, merchant_ids: list[str], count: int, per_run: int, profile: cProfile.Profile | None) -> dict[str, Any]:
    from django.db import connection

    from payments.models import OutboxEvent
    from webhooks.models import WebhookDelivery
    from webhooks.services.relay import outbox_relay_run

    targets = merchant_ids if shape == "spread" else merchant_ids[:1]
    statements = 0
    cpu = wall = 0.0

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    runs = 0
    postgres = 0.0
    for offset in range(0, count, per_run):
        # `per_run` events commit between relay runs, as payments do between kicks (the
        # events' writing is not measured).
        _events_write(targets[offset % len(targets):] + targets[: offset % len(targets)], min(per_run, count - offset))
        connection.ensure_connection()
        backend = connection.connection.info.backend_pid
        started_cpu, started_wall, started_postgres = time.process_time(), time.perf_counter(), cpu_ms(backend)
        with connection.execute_wrapper(counting):
            if profile:
                profile.enable()
            while True:
                runs += 1
                outbox_relay_run()
                if not (
                    OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True).exists()
                    or WebhookDelivery.objects.filter(status="pending").exists()
                ):
                    break
            if profile:
                profile.disable()
        cpu += time.process_time() - started_cpu
        wall += time.perf_counter() - started_wall
        # The same backend throughout: a reconnect would make this a different process.
        if connection.connection is not None and connection.connection.info.backend_pid == backend:
            postgres += cpu_ms(backend) - started_postgres
        else:
            raise SystemExit("the connection changed during a relay run: its PostgreSQL CPU cannot be read")
    return {
        "events": count,
        "events_per_run": per_run,
        "relay_runs": runs,
        "cpu_ms_per_event": round(cpu * 1000 / count, 3),
        "postgres_backend_cpu_ms_per_event": round(postgres / count, 3),
        "wall_ms_per_event": round(wall * 1000 / count, 3),
        "statements_per_event": round(statements / count, 2),
        "prepared_statements": _prepared_count(connection),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--shapes", default="spread,hot")
    parser.add_argument("--per-run", type=int, default=5, help="events committed between relay runs")
    parser.add_argument("--receiver-port", type=int, default=8768)
    parser.add_argument("--cprofile", type=int, default=0, help="print cProfile's top N functions by own time")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_relay")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    args = parser.parse_args()

    receiver = multiprocessing.Process(target=_serve, args=(args.receiver_port,), daemon=True)
    receiver.start()
    os.environ.update(TALLY_WEBHOOK_ALLOW_HTTP="true", TALLY_WEBHOOK_ALLOW_LOOPBACK="true", TALLY_OUTBOX_RELAY_KICK="false")
    try:
        seed(args.database_url, args.redis_url)
        from django_tenants.utils import schema_context

        from wallets.models import Merchant
        from webhooks.models import WebhookDelivery, WebhookEndpoint
        from webhooks.services.endpoints import webhook_endpoint_create
        from webhooks.services.relay import outbox_relay_run

        url = f"http://127.0.0.1:{args.receiver_port}/hooks"
        result: dict[str, Any] = {}
        profile = cProfile.Profile() if args.cprofile else None
        with schema_context(SCHEMA):
            outbox_relay_run()  # drain what the seed wrote
            WebhookEndpoint.objects.exclude(url=url).delete()
            merchant_ids = list(Merchant.objects.order_by("id").values_list("id", flat=True))
            have = set(WebhookEndpoint.objects.values_list("merchant_id", flat=True))
            for merchant_id in merchant_ids:
                if merchant_id not in have:
                    webhook_endpoint_create(merchant=Merchant.objects.get(pk=merchant_id), url=url, enabled_events=["*"])
            WebhookDelivery.objects.filter(status="pending").delete()
            for shape in args.shapes.split(","):
                result[shape] = _measure(shape, merchant_ids, args.events, args.per_run, profile)
        result["merchants"] = len(merchant_ids)
        print(json.dumps(result, indent=2))
        if profile:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(os.environ.get("CPROFILE_SORT", "tottime")).print_stats(args.cprofile)
            print(out.getvalue())
    finally:
        receiver.terminate()


if __name__ == "__main__":
    main()
