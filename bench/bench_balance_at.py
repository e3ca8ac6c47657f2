"""Time balances at an instant (wallets/books.py): `GET /v1/merchant/balance?at=` for a
merchant with a million ledger entries, and the trial balance of a tenant with 100,000
accounts.

    .venv/bin/python bench/bench_balance_at.py --entries 1000000 --accounts 100000 --requests 500

Uses its own database (`--db`, default tally_at_bench_balance_at). The first run loads,
outside the timing, with set-based SQL (a bench loader, not the posting path): one
merchant's `--entries` entries over 400 days against the adjustments account (one in ten a
debit), and `--accounts` customers with three credits each over 60 days from the same
account; then every account's daily totals summed from the entries, as the staged
migrations' backfill writes them. Later runs reuse it (`--fresh` reloads). Then, in process
through the WSGI app (Django's test client, production settings), it times `?at=` at random
instants of the history on the daily-totals path (both migrations at `reads_switched`) and,
with fewer requests, on the ledger-only path (`absent`); and `trial_balance_at` at the
present and 30 days ago on both paths, checking each sums to zero per asset.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.harness import bench_database_open  # noqa: E402 - after the path

DB = "tally_at_bench_balance_at"
SCHEMA = "benchat"
HOST = "benchat.localhost"
DAYS = 400


def _pcts(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"p50_ms": round(times[len(times) // 2], 2), "p99_ms": round(times[max(0, int(len(times) * 0.99) - 1)], 2)}


def _load(entries: int, accounts: int) -> float:
    """The merchant, the customers, their histories and daily totals; returns the load's seconds."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from devtools.demo_seed import platform_ensure
    from tenants.services import tenant_create
    from wallets.models import Account, SystemRole
    from wallets.services.principals import merchant_create

    platform_ensure(public_domain="platform.benchat.localhost")
    tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench balance at", main_currency="JPY")
    started = time.perf_counter()
    with schema_context(SCHEMA), connection.cursor() as cursor:
        merchant = merchant_create(name="Busy merchant")
        account = Account.objects.get(merchant=merchant).pk
        source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS).pk
        params = {"rows": entries, "merchant": account, "source": source, "span": DAYS * 86400.0, "accounts": accounts}
        amount = "(CASE WHEN g %% 10 = 0 THEN -(50 + g %% 50) ELSE 100 + g %% 900 END)"
        created = "now() - make_interval(secs => (%(rows)s - g) * %(span)s / %(rows)s)"
        cursor.execute(
            f"""
            INSERT INTO wallets_ledgertransaction (id, kind, reference, created)
            SELECT 'txn_bench' || lpad(g::text, 19, '0'), 'adjustment', 'adj_bench', {created} FROM generate_series(1, %(rows)s) g;
            INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
            SELECT 'txn_bench' || lpad(g::text, 19, '0'), side.account, 'JPY', side.sign * {amount}, {created}
              FROM generate_series(1, %(rows)s) g, (VALUES (%(merchant)s, 1), (%(source)s, -1)) AS side(account, sign);
            INSERT INTO wallets_customer (id, name, created)
            SELECT 'cus_bench' || lpad(g::text, 15, '0'), 'Bench ' || g, now() - interval '61 days' FROM generate_series(1, %(accounts)s) g;
            INSERT INTO wallets_account (id, kind, customer_id, frozen, frozen_reason, created)
            SELECT 'acc_bench' || lpad(g::text, 15, '0'), 'customer', 'cus_bench' || lpad(g::text, 15, '0'), false, '',
                   now() - interval '61 days' FROM generate_series(1, %(accounts)s) g;
            INSERT INTO wallets_ledgertransaction (id, kind, reference, created)
            SELECT 'txn_cust' || lpad((g * 3 + k)::text, 19, '0'), 'adjustment', 'adj_bench',
                   now() - make_interval(secs => ((g * 7 + k * 20) %% 60) * 86400.0 + g %% 86400)
              FROM generate_series(1, %(accounts)s) g, generate_series(0, 2) k;
            INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
            SELECT t.id, CASE WHEN side.sign = 1 THEN 'acc_bench' || lpad(((substr(t.id, 9)::bigint) / 3)::text, 15, '0') ELSE %(source)s END,
                   'JPY', side.sign * (100 + (substr(t.id, 9)::bigint) %% 900), t.created
              FROM wallets_ledgertransaction t, (VALUES (1), (-1)) AS side(sign) WHERE t.id LIKE 'txn_cust%%';
            """,
            params,
        )
        cursor.execute(
            """
            INSERT INTO wallets_balance (account_id, asset_id, shard, balance, held, may_go_negative, frozen)
            SELECT account_id, asset_id, 0, SUM(amount), 0, false, false FROM wallets_ledgerentry
             WHERE account_id LIKE 'acc_bench%%' GROUP BY 1, 2;
            UPDATE wallets_balance b SET balance = b.balance + e.s
              FROM (SELECT account_id, SUM(amount) AS s FROM wallets_ledgerentry WHERE account_id IN (%(merchant)s, %(source)s)
                    GROUP BY 1) e WHERE b.account_id = e.account_id AND b.asset_id = 'JPY' AND b.shard = 0;
            INSERT INTO wallets_merchantdailytotal (account_id, asset_id, day, shard, credited, debited, entries, returned)
            SELECT account_id, asset_id, (created AT TIME ZONE 'UTC')::date, 0, SUM(GREATEST(amount, 0)), SUM(GREATEST(-amount, 0)), COUNT(*), 0
              FROM wallets_ledgerentry GROUP BY 1, 2, 3;
            ANALYZE wallets_ledgertransaction, wallets_ledgerentry, wallets_balance, wallets_merchantdailytotal, wallets_account;
            """,
            params,
        )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=1_000_000, help="the merchant's ledger entries")
    parser.add_argument("--accounts", type=int, default=100_000, help="customer accounts (three credits each) for the trial balance")
    parser.add_argument("--requests", type=int, default=500, help="timed ?at= requests on the daily-totals path")
    parser.add_argument("--ledger-requests", type=int, default=20, help="timed ?at= requests on the ledger-only path")
    parser.add_argument("--fresh", action="store_true", help="re-create the database and reload")
    parser.add_argument("--db", default=DB, help=f"the bench's own database, dropped by --fresh (default {DB})")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    load = bench_database_open(db=args.db, fresh=args.fresh, redis_url=args.redis_url)
    from django.test import Client
    from django_tenants.utils import schema_context

    from wallets.books import trial_balance_at
    from wallets.daily_totals import ACCOUNTS_MIGRATION, MIGRATION
    from wallets.models import Account, LedgerEntry, Merchant, StagedMigrationState, StagedPhase
    from wallets.services.principals import api_key_create
    from wallets.staged.phases import staged_phase_forget

    load_seconds = None if not load else round(_load(args.entries, args.accounts), 1)
    with schema_context(SCHEMA):
        merchant = Merchant.objects.get(name="Busy merchant")
        account = Account.objects.get(merchant=merchant).pk
        key = api_key_create(principal=merchant)[1]
        total = LedgerEntry.objects.filter(account_id=account).count()
        accounts = Account.objects.count()
    client = Client(HTTP_HOST=HOST, HTTP_AUTHORIZATION=f"Bearer {key}")
    now = datetime.now(UTC)
    rng = random.Random(7)
    results: dict[str, Any] = {"merchant_entries": total, "accounts": accounts, "load_seconds": load_seconds}
    # The same instants on both paths (their first answers are compared).
    instants = [(now - timedelta(seconds=rng.uniform(0, DAYS * 86400))).isoformat() for _ in range(max(args.requests, args.ledger_requests) + 5)]
    for path, phase, requests in (("summary", StagedPhase.READS_SWITCHED, args.requests), ("ledger", StagedPhase.ABSENT, args.ledger_requests)):
        with schema_context(SCHEMA):
            for name in (MIGRATION, ACCOUNTS_MIGRATION):
                StagedMigrationState.objects.update_or_create(name=name, defaults={"phase": phase, "verify_ok": True})
        staged_phase_forget()
        answers = {}
        for at in instants[:5]:  # warm
            answers[at] = client.get("/v1/merchant/balance", {"at": at}).json()
        times = []
        for at in instants[5:requests + 5]:
            started = time.perf_counter()
            response = client.get("/v1/merchant/balance", {"at": at})
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.content
        trial: dict[str, Any] = {}
        for label, at_instant in (("now", datetime.now(UTC)), ("30_days_ago", now - timedelta(days=30))):
            with schema_context(SCHEMA):
                started = time.perf_counter()
                lines = trial_balance_at(at=at_instant)
                seconds = time.perf_counter() - started
            sums: dict[str, int] = defaultdict(int)
            for line in lines:
                sums[line.asset] += line.balance
            assert all(value == 0 for value in sums.values()), sums
            trial[label] = {"seconds": round(seconds, 2), "lines": len(lines)}
        results[path] = {"at_requests": requests, "at": _pcts(times), "trial_balance": trial,
                         "sample": {at: next(line for line in body["balances"] if line["asset"] == "JPY") for at, body in answers.items()}}
    for at, summary_line in results["summary"]["sample"].items():
        assert results["ledger"]["sample"][at] == summary_line, at
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
