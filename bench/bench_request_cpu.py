"""Where a keyed terminal payment's Python goes, request by request, in one process.

    .venv/bin/python bench/bench_request_cpu.py --requests 1000
    .venv/bin/python bench/bench_request_cpu.py --requests 1000 --cprofile 25   # + top functions
    .venv/bin/python bench/bench_request_cpu.py --requests 4000 --no-layers --ab insert-batch   # or another lever: --help
    .venv/bin/python bench/bench_request_cpu.py --pieces   # single pieces timed on their own
    SHOW_SQL_CHARS=5000 .venv/bin/python bench/bench_request_cpu.py --requests 1 --show-sql   # whole statements, parameters
    .venv/bin/py-spy record -o docs/request_flame.svg -- .venv/bin/python bench/bench_request_cpu.py --requests 3000

Seeds its own database (default tally_bench_request) with bench/harness.py's `seed()`, as
bench/bench_http.py does (the bench tenant, which charges by customer id, funded customers,
merchants with terminals, fresh terminal keys), then calls the WSGI application
(`config.wsgi.application`, production settings, DEBUG off) directly, as gunicorn's sync
worker would: a hand-built environ with Host = the bench tenant, `Authorization: Bearer
tk_...`, a fresh `Idempotency-Key` and a JSON body, `POST /v1/terminal/payments`. Like the
HTTP benchmark and the drf-idempotency peer, every request pays from one wallet row (one
customer, one terminal key).

Reports per request: Python CPU (`time.process_time`), wall time, the CPU of the
request's own PostgreSQL backend (from /proc; not with `--ab` or `--pieces`), SQL
statements (counted with `connection.execute_wrapper`), Redis round trips, how long the wallet row stays
locked (from the balance rows' locking SELECT to the end of COMMIT, wall and CPU: under
one hot wallet, payments go through one at a time for that long), and the CPU split by
layer. The
layers are measured by wrapping each layer's entry point with a process-time timer that
charges a layer only its own time (nested layers are subtracted), so the split adds up to
the total and costs little; everything below an entry point (ORM, psycopg, redis-py) is
charged to the layer that called it. `--cprofile N` adds cProfile's top N functions by
own time (cProfile slows call-heavy code, so its milliseconds are inflated).

CPU time per request is robust to the machine being shared (it counts this process's and
its backend's CPU only); the wall time is not.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import SCHEMA, seed, wsgi_environ

# --- Layer accounting ---------------------------------------------------------------------

_own: dict[str, float] = collections.defaultdict(float)
_stack: list[list[Any]] = []  # [layer, started, time spent in nested layers]


def _timed(layer: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        frame = [layer, time.process_time(), 0.0]
        _stack.append(frame)
        try:
            return fn(*args, **kwargs)
        finally:
            _stack.pop()
            elapsed = time.process_time() - frame[1]
            _own[layer] += elapsed - frame[2]
            if _stack:
                _stack[-1][2] += elapsed

    return wrapper


def _wrap(owner: Any, name: str, layer: str) -> None:
    raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    if isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(_timed(layer, raw.__func__)))
    else:
        setattr(owner, name, _timed(layer, raw))


LAYERS = [
    "WSGI + Django handler (request, URL resolve, response)",
    "middleware (request id, metrics, security, common, clickjacking, audit origin, ...)",
    "tenant resolution",
    "DRF machinery (dispatch, initial, finalize_response)",
    "request body read + limit",
    "authentication (key lookup, principal)",
    "throttling (Redis pipeline)",
    "idempotency bookkeeping (fingerprint, replay cache, claim, store)",
    "view",
    "serializers: input validation",
    "serializers: output",
    "payment service (payment_create)",
    "JSON parse",
    "JSON render",
    "logging (one JSON line per request)",
    "outbox relay kick after commit (Celery publish)",
]


def _instrument() -> None:
    from django.core.handlers.wsgi import WSGIHandler
    from django.utils.deprecation import MiddlewareMixin
    from rest_framework.renderers import JSONRenderer
    from rest_framework.views import APIView

    import apikit.base as base
    import config.health
    import config.middleware
    import config.observability
    import payments.services.charges as charges
    from apikit.auth import ApiKeyAuthentication
    from apikit.idempotency import IdempotencyMixin
    from apikit.parsers import StrictJSONParser
    from apikit.throttling import KeyAndTenantThrottle
    from payments.api.terminal import PaymentViewSet

    L = LAYERS
    _wrap(WSGIHandler, "__call__", L[0])
    for cls in (config.observability.RequestIdMiddleware, config.observability.MetricsMiddleware,
                config.health.HealthMiddleware, config.middleware.ApiErrorEnvelopeMiddleware, MiddlewareMixin):
        _wrap(cls, "__call__", L[1])
    _wrap(config.middleware.FailClosedTenantMiddleware, "process_request", L[2])
    _wrap(APIView, "dispatch", L[3])
    _wrap(base, "body_limit_enforce", L[4])
    _wrap(ApiKeyAuthentication, "authenticate", L[5])
    _wrap(KeyAndTenantThrottle, "allow_request", L[6])
    _wrap(IdempotencyMixin, "_idempotent_post", L[7])
    _wrap(PaymentViewSet, "create", L[8])
    _wrap(base.FaceViewSet, "validated", L[9])
    _wrap(base.FaceViewSet, "render", L[10])
    _wrap(charges, "payment_create", L[11])
    _wrap(StrictJSONParser, "parse", L[12])
    _wrap(JSONRenderer, "render", L[13])
    import logging

    _wrap(logging.Logger, "_log", L[14])
    import payments.relaykick as outbox

    _wrap(outbox._RelayKick, "__call__", L[15])


# --- The requests ---------------------------------------------------------------------------


class _Counter:
    sql = 0
    redis = 0
    show_sql = False


class _Held:
    """The wallet row's lock window: from the locking SELECT of the balance rows to the end
    of COMMIT (every other payment of that wallet waits this long), wall and CPU."""

    since: tuple[float, float] | None = None
    wall = cpu = 0.0
    windows = 0


def _count_sql(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    _Counter.sql += 1
    if _Held.since is None and 'FOR UPDATE OF "wallets_balance"' in sql:
        _Held.since = (time.perf_counter(), time.process_time())
    if _Counter.show_sql:
        # SHOW_SQL_CHARS=N prints N characters of each statement, and its parameters.
        chars = os.environ.get("SHOW_SQL_CHARS")
        print("SQL:", " ".join(sql.split())[: int(chars or 160)], *([params] if chars else []))
    return execute(sql, params, many, context)


def _count_redis() -> None:
    import redis.client

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _Counter.redis += 1
            return fn(*args, **kwargs)

        return wrapper

    redis.client.Redis.execute_command = counted(redis.client.Redis.execute_command)  # type: ignore[method-assign]
    redis.client.Pipeline.execute = counted(redis.client.Pipeline.execute)  # type: ignore[method-assign]
    # Pipeline overrides execute_command (buffered, no round trip): only its execute counts.


def _ab_sides(lever: str, request: Callable[[Any], None], application: Any) -> dict[str, Callable[[], None]]:
    """Per lever, the shipped side first: a request made each way (the others' state restored)."""
    import fastpath.compiled
    import fastpath.prepared
    import fastpath.shapes
    from payments.services import charges

    def patched(target: Any, name: str, replacement: Any) -> Callable[[], None]:
        """A request with `target.name` replaced, restored after it (unittest.mock's
        patch.object: it also removes an attribute set on an instance)."""

        def side() -> None:
            with mock.patch.object(target, name, replacement):
                request(application)

        return side

    shipped = functools.partial(request, application)
    if lever == "compiled":  # every compiled select and update compiled by the ORM afresh, as a plain QuerySet is
        return {"compiled once": shipped, "ORM compiles each time": _orm_compiling(request, application)}
    if lever == "insert-batch":  # the server-side-binding branch, the connection unchanged
        return {
            "together": shipped,
            "one per round trip": patched(fastpath.compiled, "sends_statements_together", lambda connection: False),
        }
    if lever == "prepared":  # no statement registered: every one parsed and planned by PostgreSQL each time

        def unprepared() -> None:
            with mock.patch.dict(fastpath.prepared._REGISTERED, clear=True):
                request(application)

        return {"prepared": shipped, "unprepared": unprepared}
    if lever == "key-cache":  # TALLY_API_KEY_CACHE_SECONDS=0: the key and its principal read from PostgreSQL each request
        from django.conf import settings

        return {"cached": shipped, "read each request": patched(settings, "TALLY_API_KEY_CACHE_SECONDS", 0.0)}
    if lever == "relay-kick":  # no coalescing: every commit that wrote an event publishes a relay task
        from payments import relaykick

        return {"coalesced": shipped, "published every commit": patched(relaykick, "_kick_pending_claim", lambda schema, *, kick_token: 0)}
    if lever == "write-first":  # every payment takes the lock-first path
        return {"write first": shipped, "lock first": patched(charges, "charge_write_first", lambda *args, **kwargs: None)}
    if lever == "known-accounts":

        def forgotten() -> None:
            charges.known_accounts_forget()
            request(application)

        return {"remembered": shipped, "forgotten": forgotten}
    # shapes: every shape's declared fields deep-copied per instance, as DRF does
    from rest_framework import serializers

    return {"shallow copies": shipped, "DRF's deep copies": patched(fastpath.shapes.Serializer, "get_fields", serializers.Serializer.get_fields)}


def _orm_compiling(request: Callable[[Any], None], application: Any) -> Callable[[], None]:
    """A request whose compiled statements run as the plain QuerySets they were built from:
    each `Param` compiles to its value, and Django compiles the statement on every
    execution. The QuerySets themselves are built once, so this side still spares the
    Python of building them: the saving it shows is a lower bound."""
    import threading

    from fastpath.compiled import CompiledQuery, Param

    bound = threading.local()

    def as_sql(self: Param, compiler: Any, connection: Any) -> Any:
        return "%s", [bound.values[self.name]]

    def select(self: CompiledQuery[Any], **values: Any) -> list[Any]:
        bound.values = values
        return list(self._queryset.all())

    def update(self: CompiledQuery[Any], **values: Any) -> int:
        bound.values = values
        assert self._update is not None
        return int(self._queryset.update(**self._update))

    def side() -> None:
        with mock.patch.object(Param, "as_sql", as_sql), mock.patch.object(CompiledQuery, "select", select), \
                mock.patch.object(CompiledQuery, "update", update):
            request(application)

    return side


def _ab(sides: dict[str, Callable[[], None]], requests: int, connection: Any, lever: str) -> None:
    """Paired blocks, so that a machine whose speed drifts moves both sides alike. A
    payment's CPU is this process's and its PostgreSQL backend's (from /proc, sampled
    around each block; a block during which the connection was replaced counts for the
    Python side only)."""
    names = list(sides)
    cpu = dict.fromkeys(names, 0.0)
    backend = dict.fromkeys(names, 0.0)
    backend_blocks = dict.fromkeys(names, 0)
    sql = dict.fromkeys(names, 0)
    blocks = max(1, requests // 100)
    for side in names:  # each side's first requests (a new handler, a cold memory) are not timed
        for _ in range(20):
            sides[side]()
    with connection.execute_wrapper(_count_sql):
        for block in range(blocks):
            for side in names if block % 2 == 0 else reversed(names):
                pid, backend_before = _backend_cpu_ms(connection)
                _Counter.sql = 0
                started = time.process_time()
                for _ in range(50):
                    sides[side]()
                cpu[side] += time.process_time() - started
                sql[side] += _Counter.sql
                pid_after, backend_after = _backend_cpu_ms(connection)
                if pid_after == pid:
                    backend[side] += backend_after - backend_before
                    backend_blocks[side] += 1
    n = blocks * 50
    python_ms = {side: total / n * 1000 for side, total in cpu.items()}
    backend_ms = {side: backend[side] / max(backend_blocks[side] * 50, 1) for side in names}
    total_ms = {side: python_ms[side] + backend_ms[side] for side in names}
    shipped, other = names
    print(
        json.dumps(
            {
                "lever": lever,
                "requests_per_side": n,
                "python_cpu_ms_per_request": {side: round(ms, 3) for side, ms in python_ms.items()},
                "postgres_backend_cpu_ms_per_request": {side: round(ms, 3) for side, ms in backend_ms.items()},
                "blocks_with_backend_cpu": backend_blocks,
                "cpu_ms_per_request": {side: round(ms, 3) for side, ms in total_ms.items()},
                # What the shipped side saves, as a share of the payment's CPU without it.
                "saving_percent": round((total_ms[other] - total_ms[shipped]) / total_ms[other] * 100, 1),
                "round_trips_per_request": {side: round(count / n, 2) for side, count in sql.items()},
            },
            indent=2,
        )
    )


def _prepared_count(connection: Any) -> int:
    from fastpath.prepared import prepared_statements_of

    return sum(1 for run in prepared_statements_of(connection.connection).values() if run)


def _per_call_ms(fn: Callable[[], Any], calls: int = 2000) -> float:
    """CPU per call of `fn` (best of five runs: the least disturbed by the machine)."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - started)
    return round(best / calls * 1000, 4)


def _pieces(request: Callable[[Any], None], application: Any, connection: Any) -> None:
    """Pieces of a keyed payment too small for the paired A/B to resolve on a drifting
    machine, each timed on its own: converting the payment batch's statement string, and
    one round trip's client CPU."""

    from psycopg._encodings import conn_encoding
    from psycopg._queries import _query2pg_client, _query2pg_client_nocache

    sent: list[str] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        request(application)
        request(application)
    batches = [sql.encode() for sql in sent if sql.startswith("SAVEPOINT")]
    batch = batches[0]
    encoding = conn_encoding(connection.connection)
    _query2pg_client(batch, encoding)  # in psycopg's cache from now on

    django_cursor = connection.cursor()
    raw_cursor = connection.connection.cursor()
    print(
        json.dumps(
            {
                "batch_string_bytes": len(batch),
                "batch_string_alike_on_two_payments": len(batches) == 2 and batches[0] == batches[1],
                "batch_string_conversion_ms": {
                    "converted (a string new on every payment)": _per_call_ms(
                        lambda: _query2pg_client_nocache(batch, encoding)
                    ),
                    "from psycopg's cache (savepoints named per transaction: the same string every payment)": _per_call_ms(
                        lambda: _query2pg_client(batch, encoding)
                    ),
                },
                "round_trip_client_cpu_ms": {
                    "SET search_path through Django's cursor": _per_call_ms(
                        lambda: django_cursor.execute('SET search_path = "benchhttp","public"'), calls=1000
                    ),
                    "SELECT 1 on psycopg's cursor (Django's health check)": _per_call_ms(lambda: raw_cursor.execute("SELECT 1"), calls=1000),
                },
            },
            indent=2,
        )
    )


_STEADY_SECONDS = 86_400


def _steady() -> None:
    """Take the clock out of the run (--steady). Without a relay worker, the relay kick's
    pending mark lapses every KICK_PENDING_SECONDS and the next payment publishes a Celery
    task (about a millisecond of Python): once in some 500 requests at full speed, once in
    some 10 under valgrind, which made instruction counts depend on how fast the machine
    ran. Likewise the API key cache's TTL, the tenant cache's, the key's once-a-minute
    `last_used_at` write and the connection's CONN_MAX_AGE (a new connection prepares its
    statements again). The first warm-up payment claims the mark for the whole run; the
    mark is dropped again when the process ends."""
    import atexit

    from django.conf import settings
    from django.db import connection

    from fastpath.fastredis import fast_redis
    from payments import relaykick as outbox
    from wallets.services import principals

    connection.settings_dict["CONN_MAX_AGE"] = None  # Django: persistent, never closed for age
    connection.close_at = None
    settings.TENANT_CACHE_SECONDS = _STEADY_SECONDS
    settings.TALLY_API_KEY_CACHE_SECONDS = float(_STEADY_SECONDS)
    principals.LAST_USED_RESOLUTION_SECONDS = _STEADY_SECONDS
    outbox.KICK_PENDING_SECONDS = _STEADY_SECONDS
    mark = outbox._kick_pending_key(SCHEMA)
    fast_redis().delete(mark)
    atexit.register(fast_redis().delete, mark)


class _GcTimer:
    """CPython's collections during the timed loop (gc.callbacks): how many of each
    generation, their CPU per request, and the longest one (a request waits through it)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.cpu = 0.0
        self.longest = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        spent = time.process_time() - self._started
        self.count[info["generation"]] += 1
        self.cpu += spent
        self.longest = max(self.longest, spent)

    def __enter__(self) -> _GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self, requests: int, *, frozen: bool) -> dict[str, Any]:
        return {
            "frozen_after_load": frozen,
            "collections_by_generation": self.count,
            "cpu_ms_per_request": round(self.cpu / requests * 1000, 3),
            "longest_ms": round(self.longest * 1000, 1),
        }


def _backend_cpu_ms(connection: Any) -> tuple[int, float]:
    """The PostgreSQL backend serving `connection` (same machine): its pid and the CPU
    (user + system) it has used, in ms."""
    from bench.cpu_by_process import cpu_ms

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    return pid, cpu_ms(pid)


def _mandate_permit(*, key: str, customer_id: str) -> None:
    """--permit mandate: the bench tenant stops charging by customer id on its own setting;
    the customer grants the key's merchant a mandate instead (seed() sets the setting again)."""
    from django_tenants.utils import schema_context

    from payments.services.mandates import mandate_grant
    from tenants.models import Tenant
    from wallets.models import Customer
    from wallets.selectors import api_key_get_active

    Tenant.objects.filter(schema_name=SCHEMA).update(charge_by_customer_id=False)
    with schema_context(SCHEMA):
        api_key = api_key_get_active(raw_key=key)
        assert api_key is not None and api_key.terminal is not None
        merchant = api_key.terminal.store.merchant
        mandate_grant(customer=Customer.objects.get(pk=customer_id), merchant=merchant)  # returns the active one if granted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_request")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--log-level", default="INFO", help="TALLY_LOG_LEVEL (production default INFO: one JSON line per request)")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="also print cProfile's top N functions by own time")
    parser.add_argument("--sort", default="tottime", help="with --cprofile: tottime or cumulative")
    parser.add_argument("--callers", default="", metavar="REGEX", help="with --cprofile: who calls the functions matching REGEX")
    parser.add_argument("--callees", default="", metavar="REGEX", help="with --cprofile: what the functions matching REGEX call")
    parser.add_argument("--show-sql", action="store_true", help="print each statement (use with a few --requests)")
    parser.add_argument(
        "--permit", choices=["tenant", "mandate"], default="tenant",
        help="what lets the terminal charge by customer id: the tenant's setting (as bench_http.py's tenant) or the "
        "customer's mandate for the merchant (as `make run`'s demo tenant, where a newcomer grants one first)",
    )
    parser.add_argument(
        "--amount", type=int, default=1,
        help="JPY a payment: 1 earns no reward (two ledger entries); 450, the newcomer's payment, earns points and carbon (six)",
    )
    parser.add_argument("--no-layers", action="store_true", help="skip the layer timers (for py-spy: the plain path)")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="freeze the collector after loading the app, as config/gunicorn.py's workers do"
    )
    parser.add_argument("--pieces", action="store_true", help="time single pieces of a payment on their own, then stop")
    parser.add_argument(
        "--ab",
        choices=["compiled", "insert-batch", "prepared", "key-cache", "relay-kick", "write-first", "known-accounts", "shapes"],
        help="A/B in one process, alternating blocks of 50 requests, printing CPU per request of each side, the shipped "
        "side first (docs/BENCHMARKS.md): compiled = fastpath.compiled's selects and updates, or the ORM compiling the same "
        "QuerySets on every execution; insert-batch = the payment's inserts sent together, or one per round trip; "
        "prepared = registered statements sent prepared (fastpath.prepared), or plain; key-cache = API keys from the "
        "per-process cache (wallets.keycache), or read from PostgreSQL on every request; relay-kick = the outbox relay "
        "kick coalesced in Redis (fastpath.kicks: one script, a Celery publish only when no kicked relay is pending), or a "
        "Celery publish after every commit; write-first = the usual "
        "payment writes its rows before it locks (payments.services.charges), or every payment locks first; "
        "known-accounts = the payer's accounts remembered, or forgotten before each request; shapes = the shapes' fields "
        "copied shallowly (fastpath.shapes), or deep-copied as DRF does",
    )
    parser.add_argument("--side", default="", help="with --ab: run only this side of the lever, as a plain timed loop")
    parser.add_argument(
        "--steady",
        action="store_true",
        help="no work on a clock during the run (caches' TTLs, the relay kick's pending mark, CONN_MAX_AGE: see _steady), "
        "so every timed request does the same work however slowly it runs (under valgrind --tool=callgrind)",
    )
    args = parser.parse_args()
    if args.side and not args.ab:
        parser.error("--side needs --ab")

    fixtures = seed(args.database_url, args.redis_url)
    if args.permit == "mandate":
        _mandate_permit(key=fixtures["spread"][0], customer_id=fixtures["customers"][0])
    os.environ["TALLY_LOG_LEVEL"] = args.log_level
    import logging

    from django.conf import settings

    settings.LOGGING["root"]["level"] = args.log_level
    from django.utils.log import configure_logging

    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
    from django.db import connection

    from config.wsgi import application  # django.setup() again: logging is configured by now

    if args.gc_freeze:  # what gunicorn's post_worker_init does once the worker has loaded the app
        from fastpath.gcfreeze import gc_freeze_after_load

        gc_freeze_after_load()

    devnull = open(os.devnull, "w")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)

    key, customer = fixtures["spread"][0], fixtures["customers"][0]
    statuses: collections.Counter[str] = collections.Counter()

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        statuses[status.split(" ", 1)[0]] += 1
        return lambda data: None

    def request(app: Any) -> None:
        body = json.dumps({"customer": customer, "asset": "JPY", "amount": args.amount}).encode()
        result = app(wsgi_environ(body, key), start_response)
        try:
            b"".join(result)
        finally:
            result.close()  # request_finished: what gunicorn does after writing the response

    def one() -> None:
        request(application)

    _count_redis()
    commit = connection._commit

    def timed_commit() -> None:
        commit()
        if _Held.since is not None:
            _Held.wall += time.perf_counter() - _Held.since[0]
            _Held.cpu += time.process_time() - _Held.since[1]
            _Held.windows += 1
            _Held.since = None

    connection._commit = timed_commit  # type: ignore[method-assign]
    if args.steady:
        _steady()
    if args.ab and args.side:  # one side of a lever alone: what callgrind counts (bench/README.md)
        sides = _ab_sides(args.ab, request, application)
        if args.side not in sides:
            raise SystemExit(f"--side: one of {sorted(sides)}")
        one = sides[args.side]
    for _ in range(args.warmup):
        one()
    if not args.no_layers:
        _instrument()
    statuses.clear()
    _own.clear()
    _Counter.sql = _Counter.redis = 0
    _Held.wall = _Held.cpu = 0.0
    _Held.windows = 0
    _Counter.show_sql = args.show_sql
    profiler = cProfile.Profile(time.process_time) if args.cprofile else None  # CPU, not wall
    if args.pieces:
        _pieces(request, application, connection)
        return
    if args.ab and not args.side:
        _ab(_ab_sides(args.ab, request, application), args.requests, connection, args.ab)
        return
    backend = _backend_cpu_ms(connection)
    gc_timer = _GcTimer()
    with connection.execute_wrapper(_count_sql), gc_timer:
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        for _ in range(args.requests):
            one()
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    backend_after = _backend_cpu_ms(connection)
    n = args.requests
    result: dict[str, Any] = {
        "requests": n,
        "statuses": dict(statuses),
        "python_cpu_ms_per_request": round(cpu / n * 1000, 3),
        "wall_ms_per_request": round(wall / n * 1000, 3),
        # The request's own PostgreSQL backend (parse, plan, execute, its commit's WAL
        # flush); not the WAL writer, checkpointer or autovacuum, which bench_http.py's
        # split counts. None when the session was replaced during the loop.
        "postgres_backend_cpu_ms_per_request": round((backend_after[1] - backend[1]) / n, 3) if backend_after[0] == backend[0] else None,
        "sql_statements_per_request": round(_Counter.sql / n, 2),
        "redis_round_trips_per_request": round(_Counter.redis / n, 2),
        # Statements this connection sends as server-side prepared statements
        # (fastpath/prepared.py; TALLY_DB_PREPARED_STATEMENTS=false: none).
        "prepared_statements": _prepared_count(connection),
        "wallet_row_held_ms_per_request": {
            "wall": round(_Held.wall / max(_Held.windows, 1) * 1000, 3),
            "python_cpu": round(_Held.cpu / max(_Held.windows, 1) * 1000, 3),
            "windows": _Held.windows,
        },
        "layer_timers": "off" if args.no_layers else "on (their own cost is in the total)",
        "profiler": "cProfile on (inflates CPU)" if profiler else "off",
        "garbage_collector": gc_timer.report(n, frozen=args.gc_freeze),
    }
    if not args.no_layers:
        layers = {layer: round(_own.get(layer, 0.0) / n * 1000, 3) for layer in LAYERS}
        layers["(outside the wrapped entry points: bench loop, request_finished)"] = round((cpu - sum(_own.values())) / n * 1000, 3)
        result["cpu_ms_per_request_by_layer"] = layers
    print(json.dumps(result, indent=2))
    if profiler:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats(args.sort)
        stats.print_stats(args.cprofile)
        if args.callers:
            stats.print_callers(args.callers)
        if args.callees:
            stats.print_callees(args.callees)
        print(out.getvalue())


if __name__ == "__main__":
    main()
