"""Time tenant creation: cloning the template schema vs running every migration.

    .venv/bin/python bench/bench_tenant.py --count 5

Uses its own database (tally_bench_tenant), re-created each run.
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
sys.path.insert(0, str(ROOT))
DB = "tally_bench_tenant"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    os.environ["TALLY_LOG_LEVEL"] = "WARNING"

    import django

    django.setup()
    from django.core.management import call_command
    from django.test.utils import override_settings

    from tenants.services import platform_ensure, tenant_create

    call_command("migrate_schemas", "--shared", interactive=False, verbosity=0)
    platform_ensure(public_domain="bench.localhost")

    def timed(prefix: str) -> list[float]:
        times = []
        for i in range(args.count):
            started = time.perf_counter()
            tenant_create(schema_name=f"{prefix}{i}", domain=f"{prefix}{i}.localhost", name=prefix, main_currency="JPY")
            times.append(time.perf_counter() - started)
        return times

    cloned = timed("clone")
    with override_settings(TENANT_CREATION_FAKES_MIGRATIONS=False):
        migrated = timed("migrate")
    print(json.dumps({
        "count": args.count,
        "clone_median_s": round(statistics.median(cloned), 3), "clone_max_s": round(max(cloned), 3),
        "migrate_median_s": round(statistics.median(migrated), 3), "migrate_max_s": round(max(migrated), 3),
    }))


if __name__ == "__main__":
    main()
