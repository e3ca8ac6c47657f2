"""Staged migrations under payment traffic: backfill rows per second, and the p99 payment
latency during the backfill against the same traffic without it.

    .venv/bin/python bench/bench_staged.py --seconds 10 --threads 4
    .venv/bin/python bench/bench_staged.py --seconds 10 --threads 4 --rate-totals 20 --rate-contacts 1000

For each migration (merchant_daily_totals, customer_contacts; --migration to pick one), on
a fresh database (tally_bench_staged, re-created each run) with one tenant holding
history (--merchants x --days of merchant ledger postings; --customers with plaintext
contacts), it measures `payment_create` latency from --threads threads of this process:

  A  phase absent (no dual writes)                          --seconds
  B  phase expanded (dual writes on), no backfill           --seconds
  C  phase expanded, while the real `manage.py staged_migration <name> backfill` runs
     as a separate process (unthrottled, or --rate-totals / --rate-contacts), until it
     finishes

and prints p50/p99 of each, C/B and C/A, and the backfill's rows per second (merchant
accounts or customers, from its committed state) and, for the totals, ledger entries
aggregated per second. Then it runs verify and checks the ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))
DB = "tally_bench_staged"
SCHEMA = "bench"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB}"


def _setup() -> None:
    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = DATABASE_URL
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["TALLY_LOG_LEVEL"] = "WARNING"
    os.environ["TALLY_OUTBOX_RELAY_KICK"] = "false"  # no broker round trip in the measured path
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
    import django

    django.setup()
    from django.core.management import call_command

    from devtools.demo_seed import platform_ensure
    from tenants.services import tenant_create

    call_command("migrate_schemas", "--shared", interactive=False, verbosity=0)
    platform_ensure(public_domain="bench.localhost")
    tenant = tenant_create(schema_name=SCHEMA, domain="bench.staged.localhost", name="Bench", main_currency="JPY")
    tenant.charge_by_customer_id = True
    tenant.save(update_fields=["charge_by_customer_id"])
    from django_tenants.utils import schema_context

    from wallets.models import StagedMigrationState

    with schema_context(SCHEMA):  # a new tenant starts contacts encrypted: measure one from before
        StagedMigrationState.objects.filter(name="customer_contacts").delete()


def _history(*, merchants: int, days: int, customers: int) -> dict[str, Any]:
    """Parties and history, written in bulk (bench fixtures, not a money path): per merchant
    and day a few balanced postings against the adjustments account, balances to match."""
    from django.db import connection, transaction
    from django.db.models import F, Sum, Value
    from django.db.models.functions import Concat

    from tenants.models import Tenant
    from wallets.models import (
        Account,
        AccountKind,
        Balance,
        Customer,
        CustomerLegacyContact,
        LedgerEntry,
        LedgerTransaction,
        Merchant,
        Store,
        SystemRole,
        Terminal,
    )
    from wallets.services.ledger import Leg, balance_rows_create, ledger_post

    tenant = Tenant.objects.get(schema_name=SCHEMA)
    connection.set_tenant(tenant)
    with transaction.atomic():
        ms = Merchant.objects.bulk_create([Merchant(name=f"M{i}") for i in range(merchants)])
        m_accounts = Account.objects.bulk_create([Account(kind=AccountKind.MERCHANT, merchant=m) for m in ms])
        stores = Store.objects.bulk_create([Store(merchant=m, name="S") for m in ms])
        Terminal.objects.bulk_create([Terminal(store=s, name="T") for s in stores])
        cs = Customer.objects.bulk_create([Customer(name=f"C{i}") for i in range(customers)], batch_size=5000)
        c_accounts = Account.objects.bulk_create([Account(kind=AccountKind.CUSTOMER, customer=c) for c in cs], batch_size=5000)
        CustomerLegacyContact.objects.update(email=Concat(Value("c-"), "id", Value("@example.com")), phone=Value("+81 90 1234 5678"))
    balance_rows_create(accounts=Account.objects.all())
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    # Fund the paying customers (the first 400) through the ledger.
    payers = c_accounts[:400]
    with transaction.atomic():
        funding = [*(Leg(a, "JPY", 10**12) for a in payers), Leg(source, "JPY", -(10**12) * len(payers))]
        ledger_post(kind="adjustment", reference="bench", legs=funding)
    now = datetime.now(UTC)
    rng = random.Random(1)
    entries = 0
    for start in range(0, merchants, 50):
        txns, legs = [], []
        for account in m_accounts[start : start + 50]:
            for day in range(days):
                for _ in range(3):
                    created = now - timedelta(days=day, seconds=rng.randint(0, 80000))
                    amount = rng.randint(1, 5000)
                    txn = LedgerTransaction(kind="adjustment", reference="bench_history", created=created)
                    txns.append(txn)
                    legs.append((txn, account, amount, created))
        with transaction.atomic():
            LedgerTransaction.objects.bulk_create(txns, batch_size=5000)
            rows = []
            for txn, account, amount, created in legs:
                rows += [
                    LedgerEntry(transaction=txn, account=account, asset_id="JPY", amount=amount, created=created),
                    LedgerEntry(transaction=txn, account=source, asset_id="JPY", amount=-amount, created=created),
                ]
            LedgerEntry.objects.bulk_create(rows, batch_size=5000)
            entries += len(legs)
    # Balances equal their entries (shard 0 carries the history).
    sums = LedgerEntry.objects.filter(transaction__reference="bench_history").values("account_id").annotate(s=Sum("amount"))
    for row in sums:
        account_id, total = row["account_id"], row["s"]
        Balance.objects.filter(account_id=account_id, asset_id="JPY", shard=0).update(balance=F("balance") + total)
    terminals = list(Terminal.objects.select_related("store").order_by("id"))
    paying = list(Customer.objects.filter(account__in=payers))
    connection.set_schema_to_public()
    return {"tenant": tenant, "terminals": terminals, "customers": paying, "merchant_entries": entries}


def _pay(fixtures: dict[str, Any], *, threads: int, until: Any) -> list[float]:
    """Latencies (ms) of payment_create from `threads` threads until `until()` is true."""
    from django.db import connection, connections

    from payments.services.charges import payment_create

    latencies: list[float] = []
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        connection.set_tenant(fixtures["tenant"])
        mine: list[float] = []
        try:
            while not until():
                terminal, customer = rng.choice(fixtures["terminals"]), rng.choice(fixtures["customers"])
                started = time.perf_counter()
                payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=rng.randint(1, 1000))
                mine.append((time.perf_counter() - started) * 1000)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            latencies.extend(mine)
            connections.close_all()

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(errors[:3])
    return latencies


def _stats(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "payments": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2),
    }


def _runner(name: str, phase: str) -> None:
    from django_tenants.utils import schema_context

    from wallets.staged import runner
    from wallets.staged.spec import staged_migrations

    with schema_context(SCHEMA):
        migration = staged_migrations()[name]
        outcome = {"expand": runner.staged_expand, "verify": runner.staged_verify}[phase](migration=migration)
        if not outcome.ok:
            raise RuntimeError(outcome.message)


def _bench(name: str, fixtures: dict[str, Any], *, seconds: float, threads: int, batch: int, rate: float) -> dict[str, Any]:
    from django_tenants.utils import schema_context

    from wallets.models import StagedMigrationState
    from wallets.selectors import balance_entry_mismatches

    def for_seconds() -> Any:
        stop = time.monotonic() + seconds
        return lambda: time.monotonic() >= stop

    absent = _stats(_pay(fixtures, threads=threads, until=for_seconds()))
    _runner(name, "expand")
    time.sleep(2.5)  # the fence: every process sees the phase (the backfill waits for it too)
    expanded = _stats(_pay(fixtures, threads=threads, until=for_seconds()))
    env = dict(os.environ, DATABASE_URL=DATABASE_URL)
    command = [
        sys.executable, "manage.py", "staged_migration", name, "backfill",
        "--tenant", SCHEMA, "--batch", str(batch), "--rate", str(rate), "--no-progress",
    ]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    during = _stats(_pay(fixtures, threads=threads, until=lambda: process.poll() is not None))
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(out + err)
    with schema_context(SCHEMA):
        state = StagedMigrationState.objects.get(name=name)
        rows, backfill_seconds = state.rows_done, state.backfill_seconds
    _runner(name, "verify")
    with schema_context(SCHEMA):
        mismatches = balance_entry_mismatches()
    result = {
        "migration": name,
        "A_absent": absent,
        "B_expanded_no_backfill": expanded,
        "C_during_backfill": during,
        "p99_during_vs_without_backfill": round(during["p99_ms"] / expanded["p99_ms"], 2),
        "p99_during_backfill_vs_absent": round(during["p99_ms"] / absent["p99_ms"], 2),
        "p99_dual_write_vs_absent": round(expanded["p99_ms"] / absent["p99_ms"], 2),
        "backfill_batch": batch,
        "backfill_rate_limit": rate or "unthrottled",
        "backfill_rows": rows,
        "backfill_seconds": round(backfill_seconds, 2),
        "backfill_rows_per_second": round(rows / backfill_seconds, 1),
        "verify": "passed",
        "ledger_balance_mismatches": len(mismatches),
    }
    if name == "merchant_daily_totals":
        result["backfill_ledger_entries_per_second"] = round(fixtures["merchant_entries"] / backfill_seconds, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--merchants", type=int, default=300)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--customers", type=int, default=30000)
    parser.add_argument("--migration", choices=["merchant_daily_totals", "customer_contacts", "both"], default="both")
    parser.add_argument("--rate-totals", type=float, default=0.0, help="backfill --rate for merchant_daily_totals (merchants/s; 0: unthrottled)")
    parser.add_argument("--rate-contacts", type=float, default=0.0, help="backfill --rate for customer_contacts (customers/s; 0: unthrottled)")
    args = parser.parse_args()
    _setup()
    fixtures = _history(merchants=args.merchants, days=args.days, customers=args.customers)
    names = ["merchant_daily_totals", "customer_contacts"] if args.migration == "both" else [args.migration]
    batches = {"merchant_daily_totals": 5, "customer_contacts": 500}
    rates = {"merchant_daily_totals": args.rate_totals, "customer_contacts": args.rate_contacts}
    results = [_bench(name, fixtures, seconds=args.seconds, threads=args.threads, batch=batches[name], rate=rates[name]) for name in names]
    print(json.dumps({"threads": args.threads, "seconds": args.seconds, "merchants": args.merchants, "days": args.days,
                      "customers": args.customers, "results": results}, indent=2))


if __name__ == "__main__":
    main()
