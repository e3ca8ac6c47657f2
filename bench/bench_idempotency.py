"""Cost of the idempotency layer, in-process, through the real terminal payment endpoint.

    .venv/bin/python bench/bench_idempotency.py --requests 2000

Full Django stack (middleware, API-key auth, DRF, payments.services.payment_create) via
the test client, one thread. Keyed and unkeyed payments alternate (the tenant's terminal
face is `optional`, so unkeyed requests skip the mechanism) so drift hits both alike;
reported: p50/p99 of each and the added cost (keyed minus unkeyed, per percentile).
Then replays of one completed key: from Redis (read-through cache warm) and from
PostgreSQL (cache bypassed).

Uses its own database (default tally_bench_idem, --database-url) and Redis db 4, with its
own tenant, so it never touches a test or dev database.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))

SCHEMA = "bench_idem"
HOST = "bench-idem.localhost"



def _setup(database_url: str, redis_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["TALLY_LOG_LEVEL"] = "WARNING"
    from devtools.localservices import database_ensure

    database_ensure(database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate_schemas", verbosity=0, interactive=False)


def _fixtures() -> dict[str, Any]:
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.services.adjustments import adjustment_create
    from tenants.models import Tenant
    from tenants.services import tenant_create
    from wallets.services.principals import (
        api_key_create,
        customer_create,
        merchant_create,
        staff_member_get_or_create,
        store_create,
        terminal_create,
    )

    connection.set_schema_to_public()
    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench idempotency", main_currency="JPY")
    # The bench charges by customer id, as a tenant may allow (SPEC 4); the QR token is the default.
    Tenant.objects.filter(schema_name=SCHEMA).update(charge_by_customer_id=True)
    Tenant.objects.filter(schema_name=SCHEMA).update(idempotency_terminal="optional")
    with schema_context(SCHEMA):
        staff = staff_member_get_or_create(username="bench-ops")
        customer = customer_create(name="bench payer")
        adjustment_create(staff=staff, customer=customer, asset_code="JPY", amount=10**12, direction="credit", reason="bench funding")
        store = store_create(merchant=merchant_create(name="bench merchant"), name="Main")
        _, key = api_key_create(principal=terminal_create(store=store, name="Till"))
    connection.set_schema_to_public()
    return {"customer": customer.id, "terminal_key": key}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(_pct(values, 0.50) * 1000, 3), "p99_ms": round(_pct(values, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(values) * 1000, 3)}


def _engine_only(count: int) -> dict[str, Any]:
    """The mechanism alone, without HTTP: one transaction writing one row (so both pay the
    commit's WAL flush), bare (run_atomic) versus through idempotency_execute with a fresh
    key (claim, effect, stored response, Redis lookup). Alternating, like the HTTP run."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from idempotency.engine import Executed, IdempotentCall, StoredResponse
    from idempotency.entry import idempotency_execute
    from idempotency.selectors import IdempotencyPolicy
    from wallets.transactions import run_atomic

    body = b'{"id":"pay_x","amount":1}'

    def effect() -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_effect (v) VALUES (1)")

    def execute(ctx: Any) -> Executed:
        effect()
        return Executed(response=StoredResponse(status=201, headers={"Content-Type": "application/json"}, body=body))

    policy = IdempotencyPolicy()
    bare: list[float] = []
    keyed: list[float] = []
    with schema_context(SCHEMA):
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_effect (id bigserial PRIMARY KEY, v int NOT NULL)")
        for i in range(count + 100):
            call = IdempotentCall(principal_id="ter_bench", key=uuid.uuid4().hex, fingerprint="0" * 64, scope="terminal", request_id="req_bench")
            t0 = time.perf_counter()
            run_atomic(effect, operation="bench")
            t1 = time.perf_counter()
            idempotency_execute(call=call, policy=policy, execute=execute)
            t2 = time.perf_counter()
            if i >= 100:
                bare.append(t1 - t0)
                keyed.append(t2 - t1)
    b, k = _summary(bare), _summary(keyed)
    return {
        "bare_transaction": b, "through_layer": k,
        "added_p50_ms": round(k["p50_ms"] - b["p50_ms"], 3), "added_p99_ms": round(k["p99_ms"] - b["p99_ms"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="payments per variant (keyed, unkeyed)")
    parser.add_argument("--replays", type=int, default=2000)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench_idem"))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/4")
    parser.add_argument("--limit-set-calls", action="store_true", help="TENANT_LIMIT_SET_CALLS=True (no SET search_path per cursor)")
    args = parser.parse_args()

    _setup(args.database_url, args.redis_url)
    from django.conf import settings

    settings.TENANT_LIMIT_SET_CALLS = args.limit_set_calls
    world = _fixtures()
    from django.test import Client

    from fastpath import replaycache as replay_cache

    client = Client(HTTP_HOST=HOST)
    body = json.dumps({"customer": world["customer"], "asset": "JPY", "amount": 1})
    auth = {"HTTP_AUTHORIZATION": f"Bearer {world['terminal_key']}"}

    def pay(key: str | None) -> float:
        extra = dict(auth)
        if key is not None:
            extra["HTTP_IDEMPOTENCY_KEY"] = key
        started = time.perf_counter()
        response = client.post("/v1/terminal/payments", data=body, content_type="application/json", **extra)
        elapsed = time.perf_counter() - started
        assert response.status_code == 201, response.content
        return elapsed

    for _ in range(100):  # warm-up: connections, caches, code paths
        pay(None)
        pay(uuid.uuid4().hex)

    keyed: list[float] = []
    unkeyed: list[float] = []
    for i in range(args.requests):
        if i % 2:
            keyed.append(pay(uuid.uuid4().hex))
            unkeyed.append(pay(None))
        else:
            unkeyed.append(pay(None))
            keyed.append(pay(uuid.uuid4().hex))

    replay_key = uuid.uuid4().hex
    pay(replay_key)
    pay(replay_key)  # first replay fills the cache
    from_redis = [pay(replay_key) for _ in range(args.replays)]
    replay_cache._breaker_open_until = float("inf")  # bypass Redis: every replay from PostgreSQL
    try:
        from_pg = [pay(replay_key) for _ in range(args.replays)]
    finally:
        replay_cache.replay_cache_breaker_reset()

    engine = _engine_only(args.requests)
    k, u = _summary(keyed), _summary(unkeyed)
    result = {
        "requests_per_variant": args.requests,
        "unkeyed_payment": u,
        "keyed_payment": k,
        "added_by_layer": {"p50_ms": round(k["p50_ms"] - u["p50_ms"], 3), "p99_ms": round(k["p99_ms"] - u["p99_ms"], 3),
                           "mean_ms": round(k["mean_ms"] - u["mean_ms"], 3)},
        "replay_from_redis": _summary(from_redis),
        "replay_from_postgres": _summary(from_pg),
        "engine_only": engine,
        "tenant_limit_set_calls": args.limit_set_calls,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
