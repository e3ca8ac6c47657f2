"""Reconciliation time and peak memory for one tenant with 1,000,000 ledger entries.

    .venv/bin/python bench/bench_reconcile.py --entries 1000000

Loads a bench tenant fast with set-based SQL (generate_series; the append-only triggers
refuse UPDATE and DELETE on the ledger, not INSERT): customers with their accounts and
balance rows, merchants through the real service (32 balance shards each), one funding
transaction per customer from the adjustments account, then payments (a ledger
transaction, two entries and a payments row each) until the ledger holds `--entries`
entries; the balances are then set to the sums of their entries (a sound ledger: the
reconciliation must come back clean). Loading is skipped when the tenant already holds
the entries (rerun to time again).

Then times `manage.py reconcile --tenant bench_recon` in its own process and reports its
wall time, each check's time and the peak RSS of that process (getrusage of the child).

Uses its own database (default tally_bench_recon, --database-url), never a test or dev one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))

SCHEMA = "bench_recon"


def _setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
    os.environ["TALLY_LOG_LEVEL"] = "WARNING"
    from devtools.localservices import database_ensure

    database_ensure(database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate_schemas", verbosity=0, interactive=False)


def _load(*, entries: int, customers: int, merchants: int) -> None:
    from django.db import connection, transaction
    from django_tenants.utils import schema_context

    from tenants.models import Tenant
    from tenants.services import tenant_create
    from wallets.models import LedgerEntry, Merchant
    from wallets.services.principals import merchant_create

    connection.set_schema_to_public()
    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain="bench-recon.localhost", name="Bench reconciliation", main_currency="JPY")
    with schema_context(SCHEMA):
        have = LedgerEntry.objects.count()
        if have >= entries:
            print(f"{SCHEMA}: {have:,} ledger entries already loaded")
            return
        if have:
            sys.exit(f"{SCHEMA} holds {have:,} entries, fewer than {entries:,}: drop the database ({connection.settings_dict['NAME']}) and rerun")
        started = time.monotonic()
        for i in range(merchants - Merchant.objects.count()):
            merchant_create(name=f"Bench merchant {i}")
        payments = (entries - 2 * customers) // 2
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                "INSERT INTO wallets_customer (id, name, email, phone, created) "
                "SELECT 'cus_b' || g, 'Bench customer ' || g, '', '', now() FROM generate_series(1, %s) g",
                [customers],
            )
            cur.execute(
                "INSERT INTO wallets_account (id, kind, customer_id, merchant_id, system_role, frozen, frozen_reason, frozen_at, created) "
                "SELECT 'acc_b' || g, 'customer', 'cus_b' || g, NULL, NULL, false, '', NULL, now() FROM generate_series(1, %s) g",
                [customers],
            )
            cur.execute(
                "INSERT INTO wallets_balance (account_id, asset_id, shard, balance, held, may_go_negative, frozen) "
                "SELECT 'acc_b' || g, 'JPY', 0, 0, 0, false, false FROM generate_series(1, %s) g",
                [customers],
            )
            # Funding: one transaction per customer, the adjustments system account on the other side.
            cur.execute("SELECT id FROM wallets_account WHERE system_role = 'adjustments'")
            (adjustments,) = cur.fetchone()
            cur.execute(
                "INSERT INTO wallets_ledgertransaction (id, kind, reference, created) "
                "SELECT 'txn_bf' || g, 'adjustment', 'adj_b' || g, now() - interval '30 days' FROM generate_series(1, %s) g",
                [customers],
            )
            cur.execute(
                "INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created) "
                "SELECT 'txn_bf' || g, a, 'JPY', amt, now() - interval '30 days' FROM generate_series(1, %s) g, "
                "LATERAL (VALUES ('acc_b' || g, 10000000::bigint), (%s, -10000000::bigint)) v(a, amt)",
                [customers, adjustments],
            )
            cur.execute("CREATE TEMP TABLE bench_merchants AS SELECT row_number() OVER (ORDER BY m.id) - 1 AS n, m.id AS merchant_id, "
                        "a.id AS account_id FROM wallets_merchant m JOIN wallets_account a ON a.merchant_id = m.id")
            # Payments: customer g % C pays merchant g % M, spaced 0.1 s apart, so one
            # customer's payments are C x 0.1 s apart: no duplicate-charge suspects.
            cur.execute(
                "CREATE TEMP TABLE bench_pay AS SELECT g, 'cus_b' || (g %% %s + 1) AS customer_id, 'acc_b' || (g %% %s + 1) AS customer_account, "
                "bm.merchant_id, bm.account_id AS merchant_account, 100 + (g::bigint * 7919) %% 4900 AS amount, "
                "now() - interval '29 days' + g * interval '100 milliseconds' AS created "
                "FROM generate_series(1, %s) g JOIN bench_merchants bm ON bm.n = g %% %s",
                [customers, customers, payments, merchants],
            )
            cur.execute("INSERT INTO wallets_ledgertransaction (id, kind, reference, created) "
                        "SELECT 'txn_bp' || g, 'payment', 'pay_b' || g, created FROM bench_pay")
            cur.execute(
                "INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created) "
                "SELECT 'txn_bp' || g, a, 'JPY', amt, created FROM bench_pay, "
                "LATERAL (VALUES (customer_account, -amount::bigint), (merchant_account, amount::bigint)) v(a, amt)"
            )
            cur.execute(
                "INSERT INTO payments_payment (id, status, customer_id, merchant_id, store_id, terminal_id, asset_id, amount, amount_refunded, "
                "points_earned, points_reversed, carbon_grams, carbon_grams_reversed, ledger_transaction_id, created) "
                "SELECT 'pay_b' || g, 'succeeded', customer_id, merchant_id, NULL, NULL, 'JPY', amount, 0, 0, 0, 0, 0, 'txn_bp' || g, created "
                "FROM bench_pay"
            )
            # Balances = their entries (merchant and system sums on shard 0, the other shards 0).
            cur.execute(
                "UPDATE wallets_balance b SET balance = e.total FROM (SELECT account_id, asset_id, SUM(amount) AS total "
                "FROM wallets_ledgerentry GROUP BY 1, 2) e WHERE b.account_id = e.account_id AND b.asset_id = e.asset_id AND b.shard = 0"
            )
            cur.execute("DROP TABLE bench_pay; DROP TABLE bench_merchants")
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
        print(f"{SCHEMA}: loaded {LedgerEntry.objects.count():,} ledger entries ({payments:,} payments) in {time.monotonic() - started:.1f} s")


def _reconcile(database_url: str, *args: str) -> tuple[int, float, float, str]:
    """`manage.py reconcile --tenant bench_recon *args` in its own process: (exit, seconds, peak RSS MiB, stdout)."""
    env = {**os.environ, "DATABASE_URL": database_url}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "reconcile", "--tenant", SCHEMA, *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    return os.waitstatus_to_exitcode(status), seconds, usage.ru_maxrss / 1024, out


def _plant(delta: int, accounts: int) -> None:
    """Edit `accounts` customer balances by `delta` behind the ledger's back (bench only)."""
    from django.db import connection
    from django_tenants.utils import schema_context

    with schema_context(SCHEMA), connection.cursor() as cur:
        cur.execute("UPDATE wallets_balance SET balance = balance + %s WHERE account_id IN "
                    "(SELECT 'acc_b' || g FROM generate_series(1, %s) g) AND asset_id = 'JPY'", [delta, accounts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_recon")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=50_000)
    parser.add_argument("--merchants", type=int, default=100)
    parser.add_argument("--chunk-size", type=int, default=2000)
    parser.add_argument("--plant", type=int, default=20_000, help="then edit this many balances and reconcile again (findings at scale)")
    parser.add_argument("--exports-only", action="store_true", help="only the dashboard and ledger CSV timings")
    args = parser.parse_args()
    _setup(args.database_url)
    _load(entries=args.entries, customers=args.customers, merchants=args.merchants)
    if args.exports_only:
        _dashboard_time()
        _ledger_csv_time()
        return
    chunk = ["--chunk-size", str(args.chunk_size)]
    code, seconds, rss, _ = _reconcile(args.database_url, "--check", "idempotency_stuck", *chunk)
    print(f"baseline (one trivial check: Django and the command): exit {code}, {seconds:.1f} s, peak RSS {rss:.0f} MiB")
    code, seconds, rss, out = _reconcile(args.database_url, *chunk)
    print(out.rstrip())
    print(f"reconcile --tenant {SCHEMA}, clean: exit {code}, {seconds:.1f} s wall (process start included), peak RSS {rss:.0f} MiB")
    if args.plant:
        _plant(1, args.plant)
        try:
            code, seconds, rss, out = _reconcile(args.database_url, *chunk)
        finally:
            _plant(-1, args.plant)
        print("\n".join(line for line in out.splitlines() if not line.startswith("    - ")))
        print(f"reconcile --tenant {SCHEMA}, {args.plant:,} balances edited: exit {code}, {seconds:.1f} s wall, peak RSS {rss:.0f} MiB")
    _dashboard_time()
    _ledger_csv_time()


def _ledger_csv_time() -> None:
    """The ledger CSV export's generator over every entry (what the admin streams), into a null sink."""
    import csv
    import resource
    from datetime import timedelta

    from django.utils import timezone
    from django_tenants.utils import schema_context

    from reconciliation.selectors import ledger_csv_rows

    class Null:
        def write(self, value: str) -> int:
            return len(value)

    writer = csv.writer(Null())
    today = timezone.localdate()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with schema_context(SCHEMA):
        started = time.monotonic()
        rows = sum(1 for row in ledger_csv_rows(start=today - timedelta(days=60), end=today) if writer.writerow(row))
        seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"ledger CSV, 60 days: {rows - 1:,} entries in {seconds:.1f} s; this process's peak RSS {before / 1024:.0f} -> {after / 1024:.0f} MiB")


def _dashboard_time() -> None:
    from django_tenants.utils import schema_context

    from reconciliation.charts import chart_svg
    from reconciliation.selectors import dashboard_run_charts, dashboard_volume_charts

    with schema_context(SCHEMA):
        started = time.monotonic()
        charts = [chart_svg(c) for c in dashboard_volume_charts() + dashboard_run_charts()]
        print(f"dashboard data and {len(charts)} SVG charts: {time.monotonic() - started:.2f} s")


if __name__ == "__main__":
    main()
