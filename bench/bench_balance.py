"""Time `GET /v1/merchant/balance` for a merchant with a million ledger entries.

    .venv/bin/python bench/bench_balance.py --entries 1000000 --requests 1000

Uses its own database (`--db`, default tally_bench_balance). The first run loads, outside the timing, one
merchant's history with set-based SQL (a bench loader, not the posting path): `--entries`
entries over 400 days, one in ten a debit, one in a thousand a failed payout's money
coming back (`payout_back`), each against the adjustments account, its balance rows set to
match and its daily totals summed from them. Later runs reuse it
(`--fresh` reloads). Then, in process through the WSGI app (Django's test client, the
production settings), it times the endpoint with the tenant's default delay (2 days) on
both of its paths: the window's ledger entries (phase `absent`), then the daily totals
(`reads_switched`). Beside each, the raw-SQL reference: the same two reads (balance sums,
the window's pending credits: payout money coming back left out, by each credit's
transaction kind or the totals' `returned`) sent by a bare psycopg connection; and, once, what reading the whole
history would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.harness import bench_database_open  # noqa: E402 - after the path

DB = "tally_bench_balance"
SCHEMA = "benchbal"
HOST = "benchbal.localhost"
DAYS = 400


def _pcts(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"p50_ms": round(times[len(times) // 2], 2), "p99_ms": round(times[max(0, int(len(times) * 0.99) - 1)], 2)}


def _load(entries: int) -> float:
    """The merchant and its history; returns the load's seconds."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from devtools.demo_seed import platform_ensure
    from tenants.services import tenant_create
    from wallets.models import Account, SystemRole
    from wallets.services.principals import merchant_create

    platform_ensure(public_domain="platform.benchbal.localhost")
    tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench balance", main_currency="JPY")
    started = time.perf_counter()
    with schema_context(SCHEMA), connection.cursor() as cursor:
        merchant = merchant_create(name="Busy merchant")
        account = Account.objects.get(merchant=merchant).pk
        source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS).pk
        params = {"rows": entries, "merchant": account, "source": source, "span": DAYS * 86400.0}
        # Entry g: one in ten a debit, one in a thousand (a credit) a payout's money back; spread evenly over DAYS days up to now.
        amount = "(CASE WHEN g %% 10 = 0 THEN -(50 + g %% 50) ELSE 100 + g %% 900 END)"
        kind = "(CASE WHEN g %% 1000 = 5 THEN 'payout_back' ELSE 'adjustment' END)"
        created = "now() - make_interval(secs => (%(rows)s - g) * %(span)s / %(rows)s)"
        cursor.execute(
            f"""
            INSERT INTO wallets_ledgertransaction (id, kind, reference, created)
            SELECT 'txn_bench' || lpad(g::text, 19, '0'), {kind}, 'adj_bench', {created} FROM generate_series(1, %(rows)s) g;
            INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
            SELECT 'txn_bench' || lpad(g::text, 19, '0'), side.account, 'JPY', side.sign * {amount}, {created}
              FROM generate_series(1, %(rows)s) g, (VALUES (%(merchant)s, 1), (%(source)s, -1)) AS side(account, sign);
            """,
            params,
        )
        cursor.execute(
            """
            WITH total AS (SELECT SUM(amount) AS s FROM wallets_ledgerentry WHERE account_id = %(merchant)s)
            UPDATE wallets_balance SET balance = balance + CASE WHEN account_id = %(merchant)s THEN total.s ELSE -total.s END
              FROM total WHERE asset_id = 'JPY' AND shard = 0 AND account_id IN (%(merchant)s, %(source)s);
            INSERT INTO wallets_merchantdailytotal (account_id, asset_id, day, shard, credited, debited, entries, returned)
            SELECT e.account_id, e.asset_id, (e.created AT TIME ZONE 'UTC')::date, 0, SUM(GREATEST(e.amount, 0)), SUM(GREATEST(-e.amount, 0)),
                   COUNT(*), SUM(CASE WHEN t.kind = 'payout_back' THEN GREATEST(e.amount, 0) ELSE 0 END)
              FROM wallets_ledgerentry e JOIN wallets_ledgertransaction t ON t.id = e.transaction_id
             WHERE e.account_id = %(merchant)s GROUP BY 1, 2, 3;
            ANALYZE wallets_ledgertransaction, wallets_ledgerentry, wallets_balance, wallets_merchantdailytotal;
            """,
            params,
        )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=1_000_000, help="the merchant's ledger entries")
    parser.add_argument("--requests", type=int, default=1000, help="timed requests per path")
    parser.add_argument("--fresh", action="store_true", help="re-create the database and reload")
    parser.add_argument("--db", default=DB, help=f"the bench's own database, dropped by --fresh (default {DB})")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    load = bench_database_open(db=args.db, fresh=args.fresh, redis_url=args.redis_url)
    database_url = f"postgres://postgres@127.0.0.1:5432/{args.db}"
    import psycopg
    from django.test import Client
    from django_tenants.utils import schema_context

    from wallets.daily_totals import MIGRATION
    from wallets.models import Account, LedgerEntry, Merchant, StagedMigrationState, StagedPhase
    from wallets.services.principals import api_key_create
    from wallets.staged.phases import staged_phase_forget

    load_seconds = None if not load else round(_load(args.entries), 1)
    with schema_context(SCHEMA):
        merchant = Merchant.objects.get(name="Busy merchant")
        account = Account.objects.get(merchant=merchant).pk
        key = api_key_create(principal=merchant)[1]
        total = LedgerEntry.objects.filter(account_id=account).count()
    client = Client(HTTP_HOST=HOST, HTTP_AUTHORIZATION=f"Bearer {key}")
    # The delay's window as the selector reads it: today and the 2 UTC days before.
    window_start = datetime.combine(datetime.now(UTC).date() - timedelta(days=2), datetime.min.time(), tzinfo=UTC)
    raw_window = {
        "ledger": "SELECT asset_id, SUM(amount) FROM wallets_ledgerentry WHERE account_id = %(a)s AND created >= %(s)s AND asset_id = 'JPY'"
                  " AND amount > 0 AND transaction_id NOT IN (SELECT id FROM wallets_ledgertransaction WHERE kind = 'payout_back'"
                  " AND created >= %(s)s) GROUP BY asset_id",
        "summary": "SELECT asset_id, SUM(credited - returned) FROM wallets_merchantdailytotal WHERE account_id = %(a)s AND day >= %(s)s"
                   " AND asset_id = 'JPY' GROUP BY asset_id",
    }
    results: dict[str, Any] = {"entries": total, "load_seconds": load_seconds, "requests": args.requests}
    with psycopg.connect(database_url, autocommit=True) as raw:
        raw.execute(f"SET search_path TO {SCHEMA}, public")
        for path, phase in (("ledger", StagedPhase.ABSENT), ("summary", StagedPhase.READS_SWITCHED)):
            with schema_context(SCHEMA):
                StagedMigrationState.objects.update_or_create(name=MIGRATION, defaults={"phase": phase, "verify_ok": True})
            staged_phase_forget()
            for _ in range(20):
                body = client.get("/v1/merchant/balance").json()
            times = []
            for _ in range(args.requests):
                started = time.perf_counter()
                response = client.get("/v1/merchant/balance")
                times.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, response.content
            since = window_start if path == "ledger" else window_start.date()
            raw_times = []
            for _ in range(args.requests):
                started = time.perf_counter()
                raw.execute("SELECT asset_id, SUM(balance), SUM(held) FROM wallets_balance WHERE account_id = %s GROUP BY asset_id",
                            [account]).fetchall()
                raw.execute(raw_window[path], {"a": account, "s": since}).fetchall()
                raw_times.append((time.perf_counter() - started) * 1000)
            endpoint, reference = _pcts(times), _pcts(raw_times)
            jpy = next(line for line in body["balances"] if line["asset"] == "JPY")
            results[path] = {"endpoint": endpoint, "raw_sql": reference, "raw_over_endpoint_p99": round(reference["p99_ms"] / endpoint["p99_ms"], 3),
                             "jpy": jpy}
        started = time.perf_counter()
        raw.execute("SELECT SUM(amount) FROM wallets_ledgerentry WHERE account_id = %s AND amount > 0", [account]).fetchall()
        results["whole_history_credits_ms"] = round((time.perf_counter() - started) * 1000, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
