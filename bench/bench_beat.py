"""One beat cycle with N tenants of which K have due work: the relay and the top-up
recovery fanned out to every tenant (before tenants.duework) against the tasks that read
the due-work table (after); the jobs that still visit every tenant (the idempotency
purge, the safety sweep); and what marking costs a transaction that writes an event.

    .venv/bin/python bench/bench_beat.py --tenants 200 --due 5 --rounds 5

Uses its own database (tally_bench_beat), re-created each run, and Redis database 10
(`--redis`). Tasks run eagerly in this process, so a cycle's wall and CPU time are the
tenant passes themselves (no broker, no worker). Tenant 0 is created the ordinary way;
the others are copies of its tables (CREATE TABLE ... LIKE ... INCLUDING ALL), which is
all a beat pass reads. Indicative on a shared machine: compare the two sides of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))
DB = "tally_bench_beat"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--due", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--marks", type=int, default=2000, help="transactions per side of the marking A/B")
    parser.add_argument("--threads", type=int, default=4, help="concurrent writers in one tenant for the marking A/B")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/10")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB}", REDIS_URL=args.redis, DJANGO_SETTINGS_MODULE="config.settings.local",
        TALLY_LOG_LEVEL="WARNING", CELERY_TASK_ALWAYS_EAGER="true", TALLY_OUTBOX_RELAY_KICK="false",
    )

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections, transaction
    from django_tenants.utils import schema_context

    import payments.services.topup_saga as topup_saga
    import tenants.duework as duework
    from devtools.demo_seed import platform_ensure
    from payments.services.outbox import outbox_event_create
    from payments.tasks import topups_recover_all_tenants, topups_recover_due_tenants
    from tenants.models import DueWork, Tenant
    from tenants.services import tenant_create
    from webhooks.services.relay import outbox_relay_run
    from webhooks.tasks import webhooks_relay_due_tenants

    call_command("migrate_schemas", "--shared", interactive=False, verbosity=0)
    platform_ensure(public_domain="bench.localhost")
    tenant_create(schema_name="t000", domain="t000.localhost", name="t000", main_currency="JPY")
    connection.set_schema_to_public()
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 't000' AND table_type = 'BASE TABLE'")
        tables = [r[0] for r in cursor.fetchall()]
        for i in range(1, args.tenants):
            schema = f"t{i:03d}"
            cursor.execute(f'CREATE SCHEMA "{schema}"')
            for table in tables:
                cursor.execute(f'CREATE TABLE "{schema}"."{table}" (LIKE "t000"."{table}" INCLUDING ALL)')
    Tenant.objects.bulk_create([Tenant(schema_name=f"t{i:03d}", name=f"t{i:03d}", main_currency="JPY") for i in range(1, args.tenants)])
    schemas = [f"t{i:03d}" for i in range(args.tenants)]
    due_schemas = schemas[:: max(1, args.tenants // max(1, args.due))][: args.due]

    def events_make() -> None:
        for schema in due_schemas:
            with schema_context(schema), transaction.atomic():
                outbox_event_create(topic="payment.succeeded", payload={"id": "pay_bench", "object": "payment", "merchant": "mer_x"})
        connection.set_schema_to_public()

    def cycle_before() -> None:
        # What beat did every 10 s before tenants.duework: both passes in every tenant.
        for schema in schemas:
            with schema_context(schema):
                outbox_relay_run()
        topups_recover_all_tenants()

    def cycle_after() -> None:
        webhooks_relay_due_tenants()
        topups_recover_due_tenants()

    def measured(cycle: Callable[[], None]) -> dict[str, float]:
        walls, cpus = [], []
        for _ in range(args.rounds):
            events_make()
            wall, cpu = time.perf_counter(), time.process_time()
            cycle()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            connection.set_schema_to_public()
        return {"wall_ms_median": round(statistics.median(walls) * 1000, 1), "python_cpu_ms_median": round(statistics.median(cpus) * 1000, 1)}

    settle = topup_saga.topup_due_settle
    topup_saga.topup_due_settle = lambda: True  # type: ignore[assignment]  # "before" had no settle
    before = measured(cycle_before)
    topup_saga.topup_due_settle = settle
    DueWork.objects.all().delete()
    after = measured(cycle_after)
    left = DueWork.objects.count()

    # The jobs that still visit every tenant: the idempotency purge, and the sweep.
    from idempotency.tasks import idempotency_purge_all_tenants
    from webhooks.tasks import webhooks_relay_all_tenants

    def sweeps() -> None:
        webhooks_relay_all_tenants()
        topups_recover_all_tenants()

    purge = measured(lambda: idempotency_purge_all_tenants())
    sweep = measured(sweeps)

    # Marking: the time of the mark statement itself, in transactions that each write one
    # event (the row exists: the steady state), alone and with concurrent writers of the
    # same tenant (a row lock would show here as waits).
    import payments.relaykick as relaykick

    mark = duework.due_work_mark
    spent: list[float] = []
    lock = threading.Lock()

    def timed_mark(**kwargs: object) -> None:
        started = time.perf_counter()
        mark(**kwargs)  # type: ignore[arg-type]
        with lock:
            spent.append(time.perf_counter() - started)

    def writes(count: int) -> None:
        with schema_context("t000"):
            for _ in range(count):
                with transaction.atomic():
                    outbox_event_create(topic="bench.mark", payload={"id": "", "object": "bench"})

    def threaded(count: int) -> None:
        def body() -> None:
            try:
                writes(count // args.threads)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=body) for _ in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    relaykick.due_work_mark = timed_mark  # type: ignore[assignment]
    writes(100)  # warm up
    results: dict[str, float] = {}
    for name, run in (("sequential", writes), (f"{args.threads}_threads", threaded)):
        spent.clear()
        run(args.marks)
        ordered = sorted(spent)
        results[f"{name}_mark_us_p50"] = round(ordered[len(ordered) // 2] * 1e6, 1)
        results[f"{name}_mark_us_p99"] = round(ordered[int(len(ordered) * 0.99)] * 1e6, 1)
    relaykick.due_work_mark = mark

    print(json.dumps({
        "tenants": args.tenants, "due": len(due_schemas), "rounds": args.rounds,
        "cycle_before_all_tenants": before, "cycle_after_due_table": after, "due_rows_left_after_settle": left,
        "every_10_min_idempotency_purge_all_tenants": purge, "every_10_min_safety_sweep_all_tenants": sweep,
        "marking": results,
    }, indent=1))


if __name__ == "__main__":
    main()
