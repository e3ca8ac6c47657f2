"""Time a month's statement end to end through the WSGI app: CSV of 100,000 lines (streamed),
PDF of 10,000 lines.

    .venv/bin/python bench/bench_statements.py --csv-lines 100000 --pdf-lines 10000

Uses its own database (`--db`, default tally_stmt_bench). The first run loads, outside the
timing, two merchants' months with set-based SQL (a bench loader, not the posting path):
`--csv-lines` entries in November 2026 on one, `--pdf-lines` on the other, each against the
adjustments account, plus a year of earlier history on each (the opening balance's read).
Later runs reuse it (`--fresh` reloads). Then, in process through Django's test client on
the production settings, it asks `GET /v1/merchant/statements?asset=JPY&month=2026-11`
with format=csv and consumes the streamed body row by row, then format=pdf, and reports
seconds, streamed pieces, bytes and the Python heap's peak (tracemalloc) while each ran, and the
process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.harness import bench_database_open  # noqa: E402 - after the path

DB = "tally_stmt_bench"
SCHEMA = "benchstmt"
HOST = "benchstmt.localhost"
MONTH_START = "2026-11-01T00:00:00+00"


def _load(name: str, lines: int) -> None:
    """A merchant with `lines` entries in November 2026 and 2,000 in the year before."""
    from django.db import connection

    from wallets.models import Account, SystemRole
    from wallets.services.principals import merchant_create

    merchant = merchant_create(name=name)
    account = Account.objects.get(merchant=merchant).pk
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS).pk
    with connection.cursor() as cursor:
        for part, count, start, span in (("y", 2000, "2025-11-01T00:00:00+00", "365 days"), ("m", lines, MONTH_START, "29 days")):
            cursor.execute(
                """
                WITH t AS (
                    INSERT INTO wallets_ledgertransaction (id, kind, reference, created)
                    SELECT 'ltx_b' || %(name)s || i, 'adjustment', 'adj_b' || %(name)s || i,
                           %(start)s::timestamptz + (%(span)s::interval * i / %(count)s)
                    FROM generate_series(1, %(count)s) AS i
                    RETURNING id, created
                )
                INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
                SELECT t.id, side.account, 'JPY', side.amount, t.created
                FROM t, LATERAL (VALUES (%(account)s, 100), (%(source)s, -100)) AS side(account, amount)
                """,
                {"name": f"{name[:3].lower()}{part}{count}_", "start": start, "span": span, "count": count, "account": account, "source": source},
            )


def _timed(client: Any, key: str, fmt: str, *, traced: bool) -> dict[str, Any]:
    """One request, its body consumed; `traced`: under tracemalloc (its peak; slower), else timed."""
    if traced:
        tracemalloc.start()
    began = time.perf_counter()
    response = client.get("/v1/merchant/statements", {"asset": "JPY", "month": "2026-11", "format": fmt}, HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content[:500]
    size = pieces = 0
    if response.streaming:
        for chunk in response.streaming_content:
            size += len(chunk)
            pieces += 1
    else:
        size = len(response.content)
    seconds = time.perf_counter() - began
    if not traced:
        return {"format": fmt, "seconds": round(seconds, 2), "streamed_pieces": pieces or None, "bytes": size}
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"format": fmt, "heap_peak_mb": round(peak / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv-lines", type=int, default=100_000)
    parser.add_argument("--pdf-lines", type=int, default=10_000)
    parser.add_argument("--fresh", action="store_true", help="re-create the database and reload")
    parser.add_argument("--db", default=DB, help=f"the bench's own database, dropped by --fresh (default {DB})")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    bench_database_open(db=args.db, fresh=args.fresh, redis_url=args.redis_url)
    from django.db import connection
    from django.test import Client
    from django_tenants.utils import schema_context

    from tenants.models import Tenant
    from tenants.services import tenant_create
    from wallets.models import Merchant
    from wallets.services.principals import api_key_create

    connection.set_schema_to_public()
    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench statements", main_currency="JPY")
    names = {"csv": f"CSV merchant {args.csv_lines}", "pdf": f"PDF merchant {args.pdf_lines}"}
    lines = {"csv": args.csv_lines, "pdf": args.pdf_lines}
    keys = {}
    with schema_context(SCHEMA):
        for fmt, name in names.items():
            if not Merchant.objects.filter(name=name).exists():
                _load(name, lines[fmt])
            keys[fmt] = api_key_create(principal=Merchant.objects.get(name=name))[1]
    client = Client(HTTP_HOST=HOST)
    results = []
    for fmt in ("csv", "pdf"):
        timed = _timed(client, keys[fmt], fmt, traced=False)
        results.append({**timed, "lines": lines[fmt], **_timed(client, keys[fmt], fmt, traced=True)})
    peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps({"results": results, "process_peak_rss_mb": peak_rss_mb}, indent=2))


if __name__ == "__main__":
    main()
