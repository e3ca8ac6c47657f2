"""Time the tenant admin's payment list (changelist) at a million payments.

    .venv/bin/python bench/bench_admin.py --rows 1000000 --requests 40

Uses its own database (tally_bench_admin). The first run creates it, a bench tenant and
bulk-loads the payments with one `INSERT .. SELECT generate_series` (a bench loader, not
the payment path: the rows only have to look like payments); later runs reuse them
(`--fresh` re-creates). Then it logs a superuser into the tenant admin (Django's test
client, in process: middleware, admin, templates; no HTTP server) and times each page N
times, after one warm-up request: the plain list, a filter, an id search, the date
drill-down, a deep page, and one payment's page. `--django-defaults` is the reference run:
the same pages with Django's paginator, full result count and date drill-down.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))
DB = "tally_bench_admin"
SCHEMA = "bench"
HOST = "bench.localhost"


def _database(fresh: bool) -> bool:
    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone() is not None
        if exists and not fresh:
            return False
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    return True


def _load(rows: int) -> float:
    from django.db import connection
    from django_tenants.utils import schema_context

    from devtools.demo_seed import platform_ensure
    from tenants.services import tenant_create
    from wallets.models import Merchant
    from wallets.services.principals import customer_create, merchant_create, store_create, terminal_create

    platform_ensure(public_domain="platform.bench.localhost")
    tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench", main_currency="JPY")
    with schema_context(SCHEMA):
        customers = [customer_create(name=f"Customer {i}").pk for i in range(50)]
        for i in range(10):
            merchant = merchant_create(name=f"Merchant {i}")
            terminal_create(store=store_create(merchant=merchant, name="Store"), name="Till")
        merchants = list(Merchant.objects.values_list("pk", "stores__pk", "stores__terminals__pk"))
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                INSERT INTO {SCHEMA}.payments_payment (id, status, customer_id, merchant_id, store_id, terminal_id, asset_id, amount,
                    amount_refunded, points_earned, points_reversed, carbon_grams, carbon_grams_reversed, ledger_transaction_id, created)
                SELECT 'pay_bench' || lpad(g::text, 19, '0'), 'succeeded', (%(customers)s::text[])[1 + g %% 50],
                       (%(merchants)s::text[])[1 + g %% 10], (%(stores)s::text[])[1 + g %% 10], (%(terminals)s::text[])[1 + g %% 10],
                       'JPY', 100 + g %% 5000, 0, (100 + g %% 5000) / 100, 0, (100 + g %% 5000) / 2, 0,
                       'txn_bench' || lpad(g::text, 19, '0'), now() - make_interval(secs => (%(rows)s - g) * 30)
                FROM generate_series(1, %(rows)s) AS g
                """,
                {"customers": customers, "merchants": [m[0] for m in merchants], "stores": [m[1] for m in merchants],
                 "terminals": [m[2] for m in merchants], "rows": rows},
            )
            cursor.execute(f"ANALYZE {SCHEMA}.payments_payment")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--fresh", action="store_true", help="re-create the database and reload")
    parser.add_argument("--django-defaults", action="store_true",
                        help="reference run: Django's own paginator (full COUNT(*)), full result count and date drill-down (DISTINCT)")
    args = parser.parse_args()

    created = _database(args.fresh)
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["TALLY_LOG_LEVEL"] = "WARNING"

    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client
    from django_tenants.utils import schema_context

    from devtools.demo_seed import staff_login_ensure
    from payments.models import Payment

    call_command("migrate_schemas", "--shared", interactive=False, verbosity=0)
    load_seconds = _load(args.rows) if created else None
    call_command("migrate_schemas", interactive=False, verbosity=0)
    with schema_context(SCHEMA):
        user = staff_login_ensure(username="bench-admin", password="bench-admin-pw", superuser=True).user
        total = Payment.objects.count()
        one = Payment.objects.order_by("-created", "-id").values_list("pk", flat=True)[500]
        merchant = Payment.objects.values_list("merchant_id", flat=True)[:1][0]
        newest = Payment.objects.order_by("-created").values_list("created", flat=True)[0]
        client = Client(HTTP_HOST=HOST)
        client.force_login(user)  # the session lives in the tenant's schema

    pages = {
        "list": "/admin/payments/payment/",
        "filter year": f"/admin/payments/payment/?created__year={newest.year}",
        "search payment id": f"/admin/payments/payment/?q={one}",
        "search merchant id": f"/admin/payments/payment/?q={merchant}",
        "date drill-down (month)": f"/admin/payments/payment/?created__year={newest.year}&created__month={newest.month}",
        "page 100": f"/admin/payments/payment/?p={min(100, total // 50 - 1)}",
        "one payment": f"/admin/payments/payment/{one}/change/",
    }
    if args.django_defaults:
        from django.contrib import admin
        from django.core.paginator import Paginator

        payment_admin = admin.site.get_model_admin(Payment)
        payment_admin.paginator = Paginator
        payment_admin.show_full_result_count = True
        payment_admin.change_list_template = None
    results = {}
    for label, path in pages.items():
        response = client.get(path)
        assert response.status_code == 200, (label, response.status_code)
        times = []
        for _ in range(args.requests):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        times.sort()
        results[label] = {
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
            "max_ms": round(times[-1], 1),
        }
    summary = {
        "django_defaults": args.django_defaults, "payments": total, "requests_per_page": args.requests,
        "load_seconds": load_seconds, "pages": results,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
