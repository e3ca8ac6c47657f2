"""`make run`'s settings plus the bench-only tenant app bench.tenantcol (bench/bench_tenants.py)."""

import os

from config.settings.local import *  # noqa: F403
from config.settings.local import SHARED_APPS, TENANT_APPS

TENANT_APPS = [*TENANT_APPS, "bench.tenantcol"]
INSTALLED_APPS = list(SHARED_APPS) + [a for a in TENANT_APPS if a not in SHARED_APPS]
MIGRATION_MODULES = {"tenantcol": os.environ.get("TALLY_BENCH_COLUMN_MIGRATIONS", "bench.tenantcol.migrations")}
# The beat phase runs each beat entry inline, its per-tenant fan-out included; tasks the
# creation phase enqueues (relay kicks) run inline too, leaving no backlog for the idle phase.
CELERY_TASK_ALWAYS_EAGER = True
# A failing task (one tenant's reconciliation run, sent after its request commits) fails
# the entry instead of being timed as a quick success.
CELERY_TASK_EAGER_PROPAGATES = True
