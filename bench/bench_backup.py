"""Time pgBackRest's full backup and restore of a database with at least `--ledger-gb` of
ledger, and measure the WAL archive's lag (the RPO of a restore from the archive) under a
payment load.

    .venv/bin/python bench/bench_backup.py --ledger-gb 1

Runs on a PostgreSQL 15 of its own (tests/pgbackrest_support.py: archive_mode on, every WAL
segment pushed by `pgbackrest archive-push` to a repository under a tmp directory, port in
5470-5489), gone at the end. It migrates Tally's schema, makes one tenant and fills its
ledger with set-based SQL (a bench loader, not the posting path) in batches until the
ledger's tables and indexes reach `--ledger-gb`, sampling the archive lag during the fill.
Then: a full backup (seconds, sizes from `pgbackrest info`); a restore of it into a new
data directory, replaying the archive to its end and started (seconds); and
`--load-seconds` of payments through `payment_create` from `--threads` threads, sampling
every 0.5 s the bytes between pg_current_wal_lsn() and the end of the last segment
pg_stat_archiver reports archived (what a restore from the archive alone would lose now).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.harness import bench_env  # noqa: E402 - after the path
from tests.pgbackrest_support import pgbackrest_node  # noqa: E402

SCHEMA = "benchbk"
ACCOUNTS = 20_000
BATCH = 500_000  # ledger transactions per statement
SEGMENT = 16 * 1024 * 1024

# Bytes of WAL written but not yet in the repository: from the end of the last archived
# segment (its name is timeline, log, segment in hex) to the current insert position.
LAG_SQL = """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')
       - COALESCE(('x' || substr(last_archived_wal, 9, 8))::bit(32)::bigint * 4294967296
                  + (('x' || substr(last_archived_wal, 17, 8))::bit(32)::bigint + 1) * %(segment)s, 0)
  FROM pg_stat_archiver
"""

def _ledger_bytes(cursor: Any) -> int:
    cursor.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname IN ('wallets_ledgertransaction', 'wallets_ledgerentry')", [SCHEMA])
    return int(cursor.fetchone()[0] or 0)


class LagSampler:
    """A thread sampling the archive lag (bytes) every 0.5 s on its own connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[int] = []  # unarchived WAL, bytes
        self.written: list[tuple[float, int]] = []  # (monotonic time, WAL position in bytes)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(0.5):
                row = conn.execute(LAG_SQL, {"segment": SEGMENT}).fetchone()
                if row is not None:
                    self.written.append((time.monotonic(), int(row[0])))
                    self.samples.append(max(0, int(row[1])))

    def summary(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        ordered = sorted(self.samples) or [0]
        (t0, w0), (t1, w1) = self.written[0], self.written[-1]
        rate = (w1 - w0) / (t1 - t0) if t1 > t0 else 0.0
        return {"wal_mb_per_s": round(rate / 1e6, 2),
                # The same lag as time: how long the unarchived WAL took to write at this rate.
                "p50_s": round(ordered[len(ordered) // 2] / rate, 1) if rate else 0.0,
                "max_s": round(ordered[-1] / rate, 1) if rate else 0.0,"samples": len(ordered), "p50_mb": round(ordered[len(ordered) // 2] / 1e6, 1),
                "p99_mb": round(ordered[int(len(ordered) * 0.99)] / 1e6, 1), "max_mb": round(ordered[-1] / 1e6, 1)}


def _fill(target_bytes: int) -> dict[str, Any]:
    from django.db import connection
    from django_tenants.utils import schema_context

    from wallets import ids
    from wallets.models import Account, AccountKind, Customer, SystemRole

    started = time.perf_counter()
    with schema_context(SCHEMA):
        batch = [Customer(id=ids.new_customer_id(), name=f"Bench {n}") for n in range(ACCOUNTS)]
        Customer.objects.bulk_create(batch, batch_size=5_000)
        Account.objects.bulk_create([Account(id=ids.new_account_id(), kind=AccountKind.CUSTOMER, customer=c) for c in batch],
                                    batch_size=5_000)
        source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS).pk
        with connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE bench_accounts AS "
                           "SELECT row_number() OVER (ORDER BY id) - 1 AS n, id FROM wallets_account WHERE kind = 'customer'")
            first = 0
            while _ledger_bytes(cursor) < target_bytes:
                cursor.execute(
                    """
                    INSERT INTO wallets_ledgertransaction (id, kind, reference, created)
                    SELECT 'txn_bk' || lpad(g::text, 22, '0'), 'adjustment', 'adj_bench', now() FROM generate_series(%(a)s, %(b)s) g;
                    INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
                    SELECT 'txn_bk' || lpad(g::text, 22, '0'), CASE WHEN side.sign = 1 THEN a.id ELSE %(source)s END, 'JPY',
                           side.sign * (100 + g %% 900), now()
                      FROM generate_series(%(a)s, %(b)s) g JOIN bench_accounts a ON a.n = g %% %(accounts)s, (VALUES (1), (-1)) AS side(sign);
                    """,
                    {"a": first + 1, "b": first + BATCH, "source": source, "accounts": ACCOUNTS},
                )
                first += BATCH
            cursor.execute("ANALYZE wallets_ledgertransaction, wallets_ledgerentry")
            return {"transactions": first, "ledger_gb": round(_ledger_bytes(cursor) / 1e9, 2),
                    "fill_seconds": round(time.perf_counter() - started, 1)}


def _payments(seconds: float, threads: int) -> int:
    """Payments through the service from `threads` threads for `seconds`; returns how many."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.services.adjustments import adjustment_create
    from payments.services.charges import payment_create
    from payments.services.mandates import mandate_grant
    from wallets.services.principals import customer_create, merchant_create, staff_member_get_or_create, store_create, terminal_create

    with schema_context(SCHEMA):
        staff = staff_member_get_or_create(username="admin")
        merchant = merchant_create(name="Bench shop")
        terminal = terminal_create(store=store_create(merchant=merchant, name="Bench store"), name="Till")
        payers = []
        for n in range(threads * 20):
            customer = customer_create(name=f"Payer {n}")
            adjustment_create(staff=staff, customer=customer, asset_code="JPY", amount=10**9, direction="credit", reason="bench")
            mandate_grant(customer=customer, merchant=merchant)
            payers.append(customer)
    counts = [0] * threads
    deadline = time.monotonic() + seconds

    def pay(n: int) -> None:
        with schema_context(SCHEMA):
            while time.monotonic() < deadline:
                payment_create(terminal=terminal, customer=payers[(n + threads * counts[n]) % len(payers)], asset_code="JPY",
                               amount=1 + counts[n])
                counts[n] += 1
        connection.close()

    workers = [threading.Thread(target=pay, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger-gb", type=float, default=1.0, help="fill the ledger's tables and indexes to at least this")
    parser.add_argument("--load-seconds", type=float, default=60.0, help="seconds of payments while the archive lag is sampled")
    parser.add_argument("--threads", type=int, default=4, help="paying threads")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    results: dict[str, Any] = {}
    with pgbackrest_node() as node:
        url = f"postgres://postgres@127.0.0.1:{node.cluster.port}/tally"
        os.environ.update(bench_env(url, args.redis_url))
        import django

        django.setup()
        from django.core.management import call_command

        from devtools.demo_seed import platform_ensure
        from tenants.services import tenant_create

        call_command("migrate_schemas", interactive=False, verbosity=0)
        platform_ensure(public_domain="platform.benchbk.localhost")
        tenant_create(schema_name=SCHEMA, domain="benchbk.localhost", name="Bench backup", main_currency="JPY")
        sampler = LagSampler(url)
        results["fill"] = _fill(int(args.ledger_gb * 1e9))
        results["archive_lag_during_fill"] = sampler.summary()
        results["database_gb"] = round(int(node.cluster.sql("SELECT pg_database_size('tally')")) / 1e9, 2)

        results["full_backup_seconds"] = round(node.backup("full"), 1)
        full = node.info()["backup"][-1]["info"]
        results["full_backup_gb"] = {"cluster": round(full["size"] / 1e9, 2), "repository": round(full["repository"]["size"] / 1e9, 2)}
        restored, seconds = node.restore(target=None, name="restored")
        results["restore_seconds"] = round(seconds, 1)  # restore, WAL replay to the archive's end, started and promoted
        results["restored_ledger_rows"] = int(restored.sql(f"SELECT count(*) FROM {SCHEMA}.wallets_ledgerentry", "tally"))
        restored.stop()

        sampler = LagSampler(url)
        results["payments"] = _payments(args.load_seconds, args.threads)
        results["payments_per_s"] = round(results["payments"] / args.load_seconds, 1)
        results["archive_lag_under_payments"] = sampler.summary()
        results["wal_archived"] = node.cluster.sql("SELECT archived_count || ' segments, ' || failed_count || ' failed' FROM pg_stat_archiver")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
