"""Webhook deliveries to slow receivers under the HTTP payment load of bench_http.py.

    .venv/bin/python bench/bench_webhooks.py --seconds 15 --clients 8 --workers 3

Seeds like bench_http.py (in its own database, tally_bench_webhooks) and starts gunicorn,
a Celery worker (--celery-concurrency processes, as `make run`'s Procfile) and Celery beat
with the production settings (loopback webhooks allowed), and a receiver on 127.0.0.1
that takes --receiver-ms per request (100 ms by default) and records when each event
first arrived. Two scenarios, each after the outbox and the deliveries have drained:

- `one-endpoint`: the hot merchant's one endpoint is the only one enabled, and it has a
  backlog of committed payment events larger than it can take in --seconds (120 per
  second of the run), relayed by the worker: deliveries/s at the receiver over --seconds
  after --warmup is the sustained rate one endpoint gets. What is left pending at the
  end is set aside (failed) so it does not weigh on the next scenario.
- `spread`: payments spread over the 200 merchants, each with an endpoint at the same
  receiver, which answers 500 for ever to the first event it gets (a poison event).
  After the load, once every other delivery has succeeded: the lag from each event's
  `created` (it precedes the commit by the rest of the transaction) to its first arrival
  at the receiver, p50, p99 and the worst, for every event but the poison one, and the
  poison one's state (pending, retried on its own).

Every process it starts is stopped at the end, whatever happens.

    .venv/bin/python bench/bench_webhooks.py --scenario cpu --events 3000 --per-run 15

`cpu` measures the relay's own CPU per delivered event, in this process, with no Celery:
the hot merchant's endpoint alone enabled (every event) at a receiver in a process of its
own (answering at once), and events arriving as a payment load brings them to a kicked
relay: --per-run committed payment events, then one `outbox_relay_run` (publish, claim,
sign, send, record), until --events are delivered. It prints this process's CPU (every
thread's, from `time.process_time`; and the dispatching thread's alone, the rest being the
sending threads') over the relay runs alone, per delivered event; the SQL
statements per delivered event; and, with --profile, the functions that took it (cProfile,
the dispatching thread only: the sending threads' share is the rest).

    .venv/bin/python bench/bench_webhooks.py --scenario transport --events 3000

`transport` measures what one POST costs the sending thread's CPU on a kept connection to
the same receiver: through `webhooks.transport` (urllib3, the SSRF-checked resolve
included) and as bare bytes on a socket (the floor a hand-written client would approach).
"""

from __future__ import annotations

import argparse
import http.server
import io
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


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Keeps connections open (as devtools/webhook_receiver.py does), takes `delay` seconds per
    request, answers 500 to the poison event (the first one it gets, once armed)."""

    protocol_version = "HTTP/1.1"
    delay = 0.1
    lock = threading.Lock()
    arrived: dict[str, float] = {}
    requests = 0
    poison_armed = False
    poison: str | None = None
    in_flight = 0
    max_in_flight = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        event_id = json.loads(body)["id"]
        now = time.time()
        cls = _Receiver
        with cls.lock:
            cls.requests += 1
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
            if cls.poison_armed and cls.poison is None:
                cls.poison = event_id
            refused = event_id == cls.poison
            if not refused:
                cls.arrived.setdefault(event_id, now)
        time.sleep(cls.delay)
        with cls.lock:
            cls.in_flight -= 1
        self.send_response(500 if refused else 200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"no" if refused else b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def _endpoints_only(receiver_url: str, *, hot: bool) -> int:
    """Enable the endpoint at `receiver_url` of the hot merchant only (`hot`) or of every
    other merchant; disable the rest. Returns how many are enabled."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from wallets.models import Merchant
    from webhooks.models import WebhookEndpoint
    from webhooks.services.endpoints import webhook_endpoint_create

    with schema_context(SCHEMA):
        WebhookEndpoint.objects.update(status="disabled")
        merchants = Merchant.objects.filter(name="Hot merchant") if hot else Merchant.objects.exclude(name="Hot merchant")
        for merchant in merchants:
            if not WebhookEndpoint.objects.filter(merchant=merchant, url=receiver_url).exists():
                webhook_endpoint_create(merchant=merchant, url=receiver_url, enabled_events=["*"])
        enabled = WebhookEndpoint.objects.filter(url=receiver_url, merchant__in=merchants)
        enabled.update(status="enabled", disabled_reason="", max_concurrency=None)
        count = enabled.count()
    connection.set_schema_to_public()
    return count


def _backlog() -> tuple[int, int]:
    """(events unpublished, deliveries pending to enabled endpoints)."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import OutboxEvent
    from webhooks.models import WebhookDelivery

    with schema_context(SCHEMA):
        result = (
            OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True).count(),
            WebhookDelivery.objects.filter(status="pending", endpoint__status="enabled").count(),
        )
    connection.set_schema_to_public()
    return result


def _set_aside_pending() -> int:
    """Every endpoint off and every pending delivery failed: the next scenario starts clean."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from webhooks.models import WebhookDelivery, WebhookEndpoint

    with schema_context(SCHEMA):
        WebhookEndpoint.objects.update(status="disabled")
        count = WebhookDelivery.objects.filter(status="pending").update(status="failed", leased_until=None)
    connection.set_schema_to_public()
    return count


def _wait_drained(timeout: float, *, but: int = 0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        unpublished, pending = _backlog()
        if unpublished == 0 and pending <= but:
            return True
        time.sleep(0.5)
    return False


def _events_since(since: Any) -> dict[str, float]:
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import OutboxEvent

    with schema_context(SCHEMA):
        events = {e: c.timestamp() for e, c in OutboxEvent.objects.filter(created__gte=since).values_list("id", "created")}
    connection.set_schema_to_public()
    return events


def _poison_state(event_id: str | None) -> dict[str, Any]:
    from django.db import connection
    from django_tenants.utils import schema_context

    from webhooks.models import WebhookDelivery

    if event_id is None:
        return {}
    with schema_context(SCHEMA):
        row = WebhookDelivery.objects.filter(event_id=event_id).values("status", "attempts", "last_status_code").first()
    connection.set_schema_to_public()
    return dict(row or {})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1) if ordered else 0.0


def _backlog_make(count: int) -> None:
    """`count` committed payment events of the hot merchant, as if its payments had come
    faster than its endpoint takes them, and a relay kicked for them."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import OutboxEvent
    from wallets.models import Merchant

    with schema_context(SCHEMA):
        hot = Merchant.objects.get(name="Hot merchant")
        stamp = int(time.time() * 1000)
        OutboxEvent.objects.bulk_create(
            [
                OutboxEvent(
                    topic="payment.succeeded", object_id=f"pay_bench{stamp}_{n}", sequence=1,
                    payload={"id": f"pay_bench{stamp}_{n}", "object": "payment", "merchant": hot.pk, "amount": n},
                )
                for n in range(count)
            ],
            batch_size=1000,
        )
    connection.set_schema_to_public()
    from config.celery import app

    app.send_task("webhooks.outbox_relay", headers={"_schema_name": SCHEMA}, ignore_result=True)


def _one_endpoint(args: argparse.Namespace, receiver_url: str) -> dict[str, Any]:
    """A backlog larger than one endpoint can take in --seconds: the receiver's rate over
    the window after --warmup is the sustained rate."""
    result: dict[str, Any] = {"endpoints": _endpoints_only(receiver_url, hot=True)}
    _Receiver.poison_armed, _Receiver.max_in_flight = False, 0
    with _Receiver.lock:
        _Receiver.arrived.clear()
    backlog = int(args.seconds * 120)  # more than 8 requests in flight at 100 ms can take
    _backlog_make(backlog)
    started = time.time()
    time.sleep(args.warmup + args.seconds)
    ended = time.time()
    with _Receiver.lock:
        times = sorted(_Receiver.arrived.values())
    first = times[0] if times else started
    window = [t for t in times if first + args.warmup <= t <= ended]
    span = ended - (first + args.warmup)
    result.update(
        backlog=backlog,
        seconds_to_first_delivery=round(first - started, 2),
        delivered_in_window=len(window),
        deliveries_per_s_sustained=round(len(window) / span, 1) if span > 0 else None,
        receiver_max_in_flight=_Receiver.max_in_flight,
        set_aside_pending=_set_aside_pending(),
    )
    return result


def _spread(args: argparse.Namespace, fixtures: dict[str, Any], receiver_url: str) -> dict[str, Any]:
    from django.utils import timezone

    result: dict[str, Any] = {"endpoints": _endpoints_only(receiver_url, hot=False)}
    _Receiver.poison_armed, _Receiver.poison, _Receiver.max_in_flight = True, None, 0
    since = timezone.now() - timedelta(milliseconds=10)
    result["http"] = drive(args.port, fixtures["spread"], fixtures["customers"], clients=args.clients, seconds=args.seconds)
    load_ended = time.monotonic()
    result["drained"] = _wait_drained(args.drain_timeout, but=1)  # all but the poison one
    result["drain_seconds_after_load"] = round(time.monotonic() - load_ended, 1)
    written = _events_since(since)
    with _Receiver.lock:
        lags = [_Receiver.arrived[e] - created for e, created in written.items() if e in _Receiver.arrived]
        poison = _Receiver.poison
    result.update(
        events_written=len(written),
        events_delivered=len(lags),
        lag_p50_ms=_pct(lags, 0.50),
        lag_p99_ms=_pct(lags, 0.99),
        lag_max_ms=_pct(lags, 1.0),
        receiver_max_in_flight=_Receiver.max_in_flight,
        poison_event=poison,
        poison_delivery=_poison_state(poison),
    )
    return result


def _fast_receiver(port: int) -> None:
    """A child process: answers every POST 200 at once, keeping connections open (bench_outbox's receiver)."""
    from bench.bench_outbox import _Ok

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    server.daemon_threads = True
    server.serve_forever()


def _transport(args: argparse.Namespace, receiver_url: str) -> dict[str, Any]:
    """CPU of one POST on a kept connection: webhooks.transport against bare bytes on a socket."""
    import socket

    from webhooks.targets import webhook_target_resolve
    from webhooks.transport import WebhookConnections

    body = json.dumps({"id": "evt_bench", "type": "payment.succeeded", "data": {"object": {"amount": 1, "currency": "JPY"}}}).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "Tally-Webhooks/1.0", "Tally-Signature": "t=1,v1=" + "0" * 64}
    result: dict[str, Any] = {"posts": args.events}
    with WebhookConnections(per_target=1) as connections:
        for _ in range(200):  # warm-up
            connections.post(target=webhook_target_resolve(url=receiver_url), body=body, headers=headers)
        started = time.thread_time()
        for _ in range(args.events):
            connections.post(target=webhook_target_resolve(url=receiver_url), body=body, headers=headers)
        result["transport_ms_per_post"] = round((time.thread_time() - started) * 1000 / args.events, 4)
    request = f"POST /hooks HTTP/1.1\r\nHost: 127.0.0.1:{args.receiver_port}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    with socket.create_connection(("127.0.0.1", args.receiver_port)) as sock:
        started = time.thread_time()
        for _ in range(args.events):
            sock.sendall(request)
            answer = b""
            while not answer.endswith(b"ok"):
                answer += sock.recv(4096)
        result["bare_socket_ms_per_post"] = round((time.thread_time() - started) * 1000 / args.events, 4)
    return result


def _cpu(args: argparse.Namespace, receiver_url: str) -> dict[str, Any]:
    """The relay's CPU per delivered event in this process (see the module's docstring)."""
    import cProfile
    import pstats

    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import OutboxEvent
    from wallets.models import Merchant
    from webhooks.models import WebhookDelivery
    from webhooks.services.relay import outbox_relay_run

    _endpoints_only(receiver_url, hot=True)
    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    profile = cProfile.Profile() if args.profile else None
    cpu = own = 0.0
    delivered = 0
    with schema_context(SCHEMA):
        hot = Merchant.objects.get(name="Hot merchant").pk
        stamp = int(time.time() * 1000)
        before = WebhookDelivery.objects.filter(status="succeeded").count()
        made = 0
        while made < args.events:
            OutboxEvent.objects.bulk_create(
                [
                    OutboxEvent(
                        topic="payment.succeeded", object_id=f"pay_cpu{stamp}_{made + n}", sequence=1,
                        payload={"id": f"pay_cpu{stamp}_{made + n}", "object": "payment", "merchant": hot, "amount": n,
                                 "currency": "JPY", "status": "succeeded"},
                    )
                    for n in range(args.per_run)
                ]
            )
            made += args.per_run
            started, own_started = time.process_time(), time.thread_time()
            with connection.execute_wrapper(count):
                if profile is not None:
                    profile.enable()
                outbox_relay_run()
                if profile is not None:
                    profile.disable()
            cpu += time.process_time() - started
            own += time.thread_time() - own_started
        delivered = WebhookDelivery.objects.filter(status="succeeded").count() - before
    connection.set_schema_to_public()
    _set_aside_pending()
    result: dict[str, Any] = {
        "events": made, "per_run": args.per_run, "delivered": delivered, "cpu_s": round(cpu, 3),
        "cpu_ms_per_delivery": round(cpu * 1000 / max(delivered, 1), 3),
        "of_which_dispatching_thread_ms": round(own * 1000 / max(delivered, 1), 3),
        "statements_per_delivery": round(statements / max(delivered, 1), 2),
    }
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(args.profile_sort).print_stats(args.profile)
        result["profile"] = out.getvalue().splitlines()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["one-endpoint", "spread", "both", "cpu", "transport"], default="both")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=3, help="gunicorn sync workers")
    parser.add_argument("--celery-concurrency", type=int, default=2)
    parser.add_argument("--receiver-ms", type=float, default=100.0)
    parser.add_argument("--port", type=int, default=8776)
    parser.add_argument("--receiver-port", type=int, default=8777)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_webhooks")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--drain-timeout", type=int, default=180)
    parser.add_argument("--events", type=int, default=3000, help="cpu: events delivered in all")
    parser.add_argument("--per-run", type=int, default=15, help="cpu: events committed before each relay run")
    parser.add_argument("--profile", type=int, default=0, help="cpu: print this many functions of a cProfile run")
    parser.add_argument("--log-level", default="WARNING", help="cpu: the root logger's level (`make run` logs at INFO)")
    parser.add_argument("--profile-sort", default="tottime", help="cpu: the order of --profile (pstats keys: tottime, cumulative)")
    args = parser.parse_args()
    if args.scenario in ("cpu", "transport"):
        os.environ["TALLY_WEBHOOK_ALLOW_HTTP"] = os.environ["TALLY_WEBHOOK_ALLOW_LOOPBACK"] = "true"
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=_fast_receiver, args=(args.receiver_port,), daemon=True)
        child.start()
        seed(args.database_url, args.redis_url)
        import logging

        logging.getLogger().setLevel(args.log_level)  # `make run` logs at INFO, the bench's settings at WARNING
        try:
            measure = _cpu if args.scenario == "cpu" else _transport
            print(json.dumps(measure(args, f"http://127.0.0.1:{args.receiver_port}/hooks"), indent=2))
        finally:
            child.terminate()
        return

    _Receiver.delay = args.receiver_ms / 1000
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", args.receiver_port), _Receiver)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    receiver_url = f"http://127.0.0.1:{args.receiver_port}/hooks"

    os.environ["TALLY_WEBHOOK_ALLOW_HTTP"] = os.environ["TALLY_WEBHOOK_ALLOW_LOOPBACK"] = "true"
    fixtures = seed(args.database_url, args.redis_url)
    _endpoints_only(receiver_url, hot=True)  # registered before the workers start
    _set_aside_pending()  # an earlier run's leftovers are not this run's work
    processes = platform_start(
        bench_env(args.database_url, args.redis_url), port=args.port, workers=args.workers,
        celery_concurrency=args.celery_concurrency, beat_schedule="/tmp/tally-bench-webhooks-beat",
    )
    result: dict[str, Any] = {
        "workers": args.workers, "clients": args.clients, "seconds": args.seconds, "receiver_ms": args.receiver_ms,
        "celery_concurrency": args.celery_concurrency,
    }
    try:
        _wait_drained(args.drain_timeout)
        if args.scenario in ("one-endpoint", "both"):
            result["one_endpoint"] = _one_endpoint(args, receiver_url)
            _wait_drained(args.drain_timeout)
        if args.scenario in ("spread", "both"):
            result["spread"] = _spread(args, fixtures, receiver_url)
            _set_aside_pending()
    finally:
        stop(*processes.values())
        receiver.shutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
