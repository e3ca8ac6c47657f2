"""Payments per second through payment_create, in-process, against the raw-SQL ceiling.

    .venv/bin/python bench/bench_ledger.py --seconds 15 --threads 16
    .venv/bin/python bench/bench_ledger.py --seconds 15 --processes 16 --threads 1

Runs payment_create from processes x threads clients (one connection each) for a fixed
time, once spread over 1,000 merchants and once to a single merchant, then runs the
raw-SQL ceiling (bench/rawsql.py, pgbench) with the same client count and duration, and
prints both, the ratios and the SQL statements per payment (counted with Django's query
capture). Threads of one process share its GIL; processes are how the service runs
(gunicorn workers, Celery prefork).

Uses its own database (default tally_bench, --database-url) with its own tenant, so it
never touches a test or dev database.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))

SCHEMA = "bench"
MERCHANTS = 1_000
CUSTOMERS = 4_000
START_BALANCE = 10**12



def _setup(database_url: str, limit_set_calls: bool) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ["DJANGO_DEBUG"] = "false"  # DEBUG keeps every query in memory
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
    os.environ["TALLY_LOG_LEVEL"] = "WARNING"
    from devtools.localservices import database_ensure

    database_ensure(database_url)
    import django
    from django.conf import settings

    django.setup()
    # django-tenants otherwise sends SET search_path before every statement (one extra
    # round trip per cursor); the search_path is per connection, so once is enough.
    settings.TENANT_LIMIT_SET_CALLS = limit_set_calls
    from django.core.management import call_command

    call_command("migrate_schemas", verbosity=0, interactive=False)


def _fixtures() -> dict[str, Any]:
    from django.db import connection
    from django_tenants.utils import schema_context

    from tenants.models import Tenant
    from tenants.services import tenant_create

    connection.set_schema_to_public()
    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain="bench.localhost", name="Bench", main_currency="JPY")
    # The bench charges by customer id, as a tenant may allow (SPEC 4); the QR token is the default.
    Tenant.objects.filter(schema_name=SCHEMA).update(charge_by_customer_id=True)
    tenant = Tenant.objects.get(schema_name=SCHEMA)
    with schema_context(SCHEMA):
        _parties_ensure()
        from wallets.models import Customer, Terminal

        customers = list(Customer.objects.order_by("id")[:CUSTOMERS])
        terminals = list(Terminal.objects.select_related("store").order_by("id")[:MERCHANTS])
    connection.set_schema_to_public()
    return {"tenant": tenant, "customers": customers, "terminals": terminals}


def _parties_ensure() -> None:
    from django.db import transaction

    from wallets.models import Account, AccountKind, Customer, Merchant, Store, SystemRole, Terminal
    from wallets.services.ledger import Leg, balance_rows_create, ledger_post

    if Terminal.objects.count() < MERCHANTS:
        with transaction.atomic():
            merchants = Merchant.objects.bulk_create([Merchant(name=f"Bench merchant {i}") for i in range(MERCHANTS)])
            Account.objects.bulk_create([Account(kind=AccountKind.MERCHANT, merchant=m) for m in merchants])
            stores = Store.objects.bulk_create([Store(merchant=m, name="Store") for m in merchants])
            Terminal.objects.bulk_create([Terminal(store=s, name="Till") for s in stores])
    if Customer.objects.count() < CUSTOMERS:
        with transaction.atomic():
            customers = Customer.objects.bulk_create([Customer(name=f"Bench customer {i}") for i in range(CUSTOMERS)])
            accounts = Account.objects.bulk_create([Account(kind=AccountKind.CUSTOMER, customer=c) for c in customers])
            source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
            legs = [Leg(a, "JPY", START_BALANCE) for a in accounts] + [Leg(source, "JPY", -START_BALANCE * len(accounts))]
            ledger_post(kind="adjustment", reference="bench_funding", legs=legs)
    # Accounts made in bulk above skip the service that gives them their balance rows.
    balance_rows_create(accounts=Account.objects.all())


def _run_threads(
    fixtures: dict[str, Any], *, threads: int, first_index: int, stride: int, start_at: float, stop_at: float, hot: bool
) -> tuple[int, list[str]]:
    """Payments from `threads` threads of this process between two wall-clock times."""
    from django.db import connection, connections

    from payments.services.charges import payment_create

    tenant, customers, terminals = fixtures["tenant"], fixtures["customers"], fixtures["terminals"]
    counts = [0] * threads
    errors: list[str] = []

    def worker(slot: int) -> None:
        index = first_index + slot
        rng = random.Random(index)
        connection.set_tenant(tenant)
        # Each client pays from its own slice of customers, as separate people would.
        mine = customers[index::stride]
        try:
            payment_create(terminal=terminals[0], customer=mine[0], asset_code="JPY", amount=1)  # warm the connection
            time.sleep(max(0.0, start_at - time.time()))
            done = 0
            while time.time() < stop_at:
                terminal = terminals[0] if hot else terminals[rng.randrange(len(terminals))]
                payment_create(terminal=terminal, customer=mine[rng.randrange(len(mine))], asset_code="JPY", amount=rng.randint(1, 1000))
                done += 1
            counts[slot] = done
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connections.close_all()

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(counts), errors


def _run(fixtures: dict[str, Any], *, processes: int, threads: int, seconds: float, hot: bool) -> dict[str, Any]:
    """`processes` processes (forked, each its own connections) x `threads` threads, all
    measuring the same wall-clock window after a warm-up."""
    import multiprocessing

    from django.db import connections

    clients = processes * threads
    start_at = time.time() + 3.0 + 0.05 * clients
    stop_at = start_at + seconds
    if processes == 1:
        done, errors = _run_threads(fixtures, threads=threads, first_index=0, stride=clients, start_at=start_at, stop_at=stop_at, hot=hot)
    else:
        connections.close_all()  # each child opens its own
        context = multiprocessing.get_context("fork")
        with context.Pool(processes) as pool:
            results = pool.starmap(
                _child,
                [(fixtures, threads, p * threads, clients, start_at, stop_at, hot) for p in range(processes)],
            )
        done = sum(r[0] for r in results)
        errors = [e for r in results for e in r[1]]
    return {"payments": done, "seconds": seconds, "tps": round(done / seconds, 1), "errors": errors[:3]}


def _child(
    fixtures: dict[str, Any], threads: int, first_index: int, stride: int, start_at: float, stop_at: float, hot: bool
) -> tuple[int, list[str]]:
    return _run_threads(fixtures, threads=threads, first_index=first_index, stride=stride, start_at=start_at, stop_at=stop_at, hot=hot)


def _statements_per_payment(fixtures: dict[str, Any]) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from payments.services.charges import payment_create

    connection.set_tenant(fixtures["tenant"])
    customer, terminal = fixtures["customers"][0], fixtures["terminals"][1]
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1)
    n = 20
    with CaptureQueriesContext(connection) as queries:
        for _ in range(n):
            payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1)
    connection.set_schema_to_public()
    return {"sql_statements_per_payment": len(queries) / n, "sample": queries[0]["sql"][:80] if queries else None}


def _ledger_check(fixtures: dict[str, Any]) -> dict[str, Any]:
    from django.db import connection

    from wallets.selectors import asset_totals, balance_entry_mismatches, ledger_unbalanced_transactions

    connection.set_tenant(fixtures["tenant"])
    result = {
        "unbalanced_transactions": len(ledger_unbalanced_transactions()),
        "balance_entry_mismatches": len(balance_entry_mismatches()),
        "asset_totals": asset_totals(),
    }
    connection.set_schema_to_public()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=16, help="threads per process")
    parser.add_argument("--processes", type=int, default=1, help="client processes (each with --threads threads and its own connections)")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench")
    parser.add_argument("--no-limit-set-calls", action="store_true", help="let django-tenants SET search_path before every statement")
    parser.add_argument("--skip-rawsql", action="store_true")
    parser.add_argument("--check-ledger", action="store_true", help="verify sums after the runs (slow on a big ledger)")
    args = parser.parse_args()

    _setup(args.database_url, limit_set_calls=not args.no_limit_set_calls)
    fixtures = _fixtures()
    statements = _statements_per_payment(fixtures)
    spread = _run(fixtures, processes=args.processes, threads=args.threads, seconds=args.seconds, hot=False)
    hot = _run(fixtures, processes=args.processes, threads=args.threads, seconds=args.seconds, hot=True)
    clients = args.processes * args.threads
    result: dict[str, Any] = {
        "processes": args.processes,
        "threads": args.threads,
        "seconds": args.seconds,
        "limit_set_calls": not args.no_limit_set_calls,
        "tally_spread_tps": spread["tps"],
        "tally_hot_tps": hot["tps"],
        "tally_hot_over_spread": round(hot["tps"] / spread["tps"], 3) if spread["tps"] else None,
        **statements,
        "errors": spread["errors"] + hot["errors"],
    }
    if not args.skip_rawsql:
        from bench.rawsql import run_ceiling

        ceiling = run_ceiling(clients=clients, seconds=args.seconds)
        result.update(ceiling)
        result["tally_spread_over_raw_spread"] = round(spread["tps"] / ceiling["rawsql_spread_tps"], 3)
        result["rawsql_hot_over_spread"] = round(ceiling["rawsql_hot_tps"] / ceiling["rawsql_spread_tps"], 3)
    if args.check_ledger:
        result["ledger"] = _ledger_check(fixtures)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
