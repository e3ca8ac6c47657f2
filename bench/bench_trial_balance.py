"""Time the trial balance of a tenant with 100,000 accounts: the selector, the back-office
page and its streamed CSV.

    .venv/bin/python bench/bench_trial_balance.py --accounts 100000

Uses its own database (`--db`, default tally_report_bench_tb). The first run loads, outside
the timing, `--accounts` customers (bulk inserts, not the posting path) and `--per-account`
ledger transactions each against the adjustments account, spread over 60 days, with set-based
SQL (a bench loader); later runs reuse it (`--fresh` reloads). Then it times, in process:
`wallets.books.trial_balance_at` (every account's balance per asset now), the page's summary
(`reconciliation.books.trial_balance_summary`), and through the WSGI app (Django's test
client, the production settings, a superuser) the page and the whole CSV read to its end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.harness import bench_database_open  # noqa: E402 - after the path

DB = "tally_report_bench_tb"
SCHEMA = "benchtb"
HOST = "benchtb.localhost"
DAYS = 60


def _load(accounts: int, per_account: int) -> float:
    from django.db import connection
    from django_tenants.utils import schema_context

    from devtools.demo_seed import platform_ensure
    from tenants.services import tenant_create
    from wallets import ids
    from wallets.models import Account, AccountKind, Customer, SystemRole

    platform_ensure(public_domain="platform.benchtb.localhost")
    tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench trial balance", main_currency="JPY")
    started = time.perf_counter()
    with schema_context(SCHEMA):
        for first in range(0, accounts, 10_000):
            batch = [Customer(id=ids.new_customer_id(), name=f"Bench {n}") for n in range(first, min(accounts, first + 10_000))]
            Customer.objects.bulk_create(batch)
            Account.objects.bulk_create([Account(id=ids.new_account_id(), kind=AccountKind.CUSTOMER, customer=c) for c in batch])
        source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS).pk
        rows = accounts * per_account
        with connection.cursor() as cursor:
            created = "now() - make_interval(secs => (%(rows)s - g) * %(span)s / %(rows)s)"
            cursor.execute(
                f"""
                CREATE TEMP TABLE bench_accounts AS
                  SELECT row_number() OVER (ORDER BY id) - 1 AS n, id FROM wallets_account WHERE kind = 'customer';
                INSERT INTO wallets_ledgertransaction (id, kind, reference, created)
                SELECT 'txn_tb' || lpad(g::text, 22, '0'), 'adjustment', 'adj_bench', {created} FROM generate_series(1, %(rows)s) g;
                INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
                SELECT 'txn_tb' || lpad(g::text, 22, '0'), CASE WHEN side.sign = 1 THEN a.id ELSE %(source)s END, 'JPY',
                       side.sign * (100 + g %% 900), {created}
                  FROM generate_series(1, %(rows)s) g
                  JOIN bench_accounts a ON a.n = g %% %(accounts)s,
                  (VALUES (1), (-1)) AS side(sign);
                -- The daily totals the postings would have kept (a new tenant's start complete).
                INSERT INTO wallets_merchantdailytotal (account_id, asset_id, day, shard, credited, debited, entries, returned)
                SELECT account_id, asset_id, (created AT TIME ZONE 'UTC')::date, 0, SUM(GREATEST(amount, 0)), SUM(GREATEST(-amount, 0)),
                       COUNT(*), 0
                  FROM wallets_ledgerentry GROUP BY 1, 2, 3;
                ANALYZE wallets_ledgertransaction, wallets_ledgerentry, wallets_account, wallets_customer, wallets_merchantdailytotal;
                """,
                {"rows": rows, "accounts": accounts, "source": source, "span": DAYS * 86400.0},
            )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accounts", type=int, default=100_000, help="customer accounts with a balance")
    parser.add_argument("--per-account", type=int, default=3, help="ledger transactions per account")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (the best and the worst are printed)")
    parser.add_argument("--fresh", action="store_true", help="re-create the database and reload")
    parser.add_argument("--db", default=DB, help=f"the bench's own database, dropped by --fresh (default {DB})")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    load = bench_database_open(db=args.db, fresh=args.fresh, redis_url=args.redis_url)
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone
    from django_tenants.utils import schema_context

    from reconciliation.books import trial_balance_summary
    from wallets.books import trial_balance_at
    from wallets.models import Account, LedgerEntry

    load_seconds = None if not load else round(_load(args.accounts, args.per_account), 1)

    def timed(fn: object) -> dict[str, float]:
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - started)
        return {"best_s": round(min(times), 2), "worst_s": round(max(times), 2)}

    results: dict[str, object] = {"load_seconds": load_seconds}
    with schema_context(SCHEMA):
        results["accounts"] = Account.objects.count()
        results["entries"] = LedgerEntry.objects.count()
        user, _ = get_user_model().objects.get_or_create(username="bench-root", defaults={"is_staff": True, "is_superuser": True})
        lines = trial_balance_at(at=timezone.now())
        results["lines"] = len(lines)
        results["sum_jpy"] = sum(line.balance for line in lines if line.asset == "JPY")
        results["selector_trial_balance_at"] = timed(lambda: trial_balance_at(at=timezone.now()))
        results["page_summary"] = timed(lambda: trial_balance_summary(at=timezone.now()))
        client = Client(HTTP_HOST=HOST)
        client.force_login(user)  # the session lives in the tenant's schema

    def page() -> None:
        response = client.get("/admin/reconciliation/reconciliationrun/trial-balance/")
        assert response.status_code == 200, response.status_code
        results["page_bytes"] = len(response.content)

    def csv() -> None:
        response = client.get("/admin/reconciliation/reconciliationrun/trial-balance.csv")
        assert response.status_code == 200, response.status_code
        results["csv_bytes"] = sum(len(chunk) for chunk in response.streaming_content)  # type: ignore[attr-defined]

    results["page_http"] = timed(page)
    results["csv_http"] = timed(csv)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
