"""The platform at N tenants: creation, migrations, a beat cycle, idle CPU, payment latency.

    .venv/bin/python bench/bench_tenants.py --tenants 100
    .venv/bin/python bench/bench_tenants.py --tenants 1000 --keep          # then, later:
    .venv/bin/python bench/bench_tenants.py --tenants 1000 --reuse --phase migrate,column

Uses its own database (default tally_bench_tenants) and Redis DB 15, with the settings
bench.tenants_settings: `make run`'s plus a bench-only tenant app (bench/tenantcol) whose
one table lets the `column` phase add a column to every tenant without touching the
project's migrations. Without --reuse the database is re-created; --keep leaves it for a
later --reuse run (creating 1,000 tenants takes a while), which creates only the tenants
still missing. Phases (--phase, comma-separated; default all), one JSON line per figure:

- create: tenants bt0000.. through `tenants.services.tenant_create` (the service the API
  and `make run` use), each then given a merchant, a store, --terminals terminals,
  --customers customers funded by an adjustment, and --payments payments each, through the
  services. Prints the creation time of the 1st, 10th, 50th, 100th, 200th, 500th, ... and
  last tenant created in this run, and the content's time per tenant.
  `--compare-django-tenants K` then times K tenants made by django-tenants' own clone
  (clone_schema) at that tenant count, and removes them.
- migrate: a no-op `manage.py migrate_schemas --tenant` (a new process each, as a deploy
  runs it): ours (skipping tenants that hold every migration), and django-tenants' visit
  of every tenant (--all-tenants) with the standard and the multiprocessing executor
  (TENANT_MULTIPROCESSING_MAX_PROCESSES, default 2).
- column: one real migration adding a NOT NULL column with a default to every tenant
  (bench/tenantcol/migrations_column/0002), with each executor, each run followed by its
  rollback (timed too), so the database ends as it started.
- beat: every entry of settings.CELERY_BEAT_SCHEDULE, and every enabled django-celery-beat
  entry (reconciliation's hourly run in every tenant), run once, in this process, with
  CELERY_TASK_ALWAYS_EAGER: the per-tenant fan-out runs inline. Wall time, this process's
  CPU and the CPU of PostgreSQL's backends for the bench database, per entry and in all,
  and that CPU spread over each entry's period (% of one core).
- idle: web, worker and beat started as `make run` does (devtools.procfile's runner and the
  Procfile, port 6450), left --idle-seconds with no traffic after --idle-warmup seconds;
  CPU per process group, PostgreSQL backends of the bench database, and redis-server (a
  shared server: other users' load lands there too), as % of one core.
- latency: --latency-requests keyed `POST /v1/terminal/payments` in tenant 1 and in the
  last tenant, in this process through the WSGI application (middleware, tenant lookup,
  API key, idempotency, payment: no socket), alternating tenants; p50 and p99 of each.
- memory: a new process serving keyed payments through the WSGI application, as a gunicorn
  worker does, one in each of --memory-tenants different tenants (a key made for each
  first); its RSS before the first request, after the first and after the last.
- session: what a session's history costs a clone of the template (`schema_clone`, into a
  probe schema dropped after each): on a new session; on the same session after it wrote a
  merchant, store, terminal and customer into each of --session-tenants tenants (foreign
  keys checked at once, every write rolled back); the same after DISCARD PLANS; and after
  the connection is closed, as `tenant_create` does. With the backend's memory.
- size: what a tenant costs: the relations of the template schema by kind (TOAST tables and
  their indexes counted apart), its size, the database's size and pg_class's rows.
- dump: `pg_dump --schema-only` of the whole database, timed (output discarded).

At 10,000 tenants (an hour or so on 2 cores), creation runs in --create-processes
processes, each over its own range of tenants, and the last ten are created alone by this
process, so their times are the figure; the visits of every tenant (--migrate-runs) and the
column's rollback (--no-column-rollback, for a database dropped afterwards) can be left out:

    .venv/bin/python bench/bench_tenants.py --tenants 10000 --create-processes 2 \
        --terminals 1 --customers 1 --payments 1 --migrate-runs skip_up_to_date \
        --column-executors multiprocessing --no-column-rollback \
        --phase create,size,migrate,column,beat,latency,memory,dump
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))

PHASES = ("create", "migrate", "column", "beat", "idle", "latency", "memory", "session", "size", "dump")
PREFIX = "bt"
PORT = 6450
MILESTONES = (1, 10, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def emit(**figure: Any) -> None:
    print(json.dumps(figure), flush=True)


def schema_of(i: int) -> str:
    return f"{PREFIX}{i:04d}"


def _env(args: argparse.Namespace, **extra: str) -> dict[str, str]:
    return {
        **os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{args.db}", "REDIS_URL": args.redis_url,
        "DJANGO_SETTINGS_MODULE": "bench.tenants_settings", "TALLY_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), **extra,
    }


def database_prepare(args: argparse.Namespace) -> None:
    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [args.db]).fetchone()
        if exists and not args.reuse:
            conn.execute(f'DROP DATABASE "{args.db}" WITH (FORCE)')
        if not exists or not args.reuse:
            conn.execute(f'CREATE DATABASE "{args.db}"')


def django_setup(args: argparse.Namespace) -> None:
    os.environ.update(_env(args))
    import django

    django.setup()


def tenant_content(*, schema: str, terminals: int, customers: int, payments: int) -> None:
    from django_tenants.utils import schema_context

    from payments.services.adjustments import adjustment_create
    from payments.services.charges import payment_create
    from wallets.services.principals import (
        customer_create,
        merchant_create,
        staff_member_get_or_create,
        store_create,
        terminal_create,
    )

    with schema_context(schema):
        merchant = merchant_create(name="Merchant")
        store = store_create(merchant=merchant, name="Store")
        tills = [terminal_create(store=store, name=f"Till {i}") for i in range(terminals)]
        staff = staff_member_get_or_create(username="bench")
        for c in range(customers):
            customer = customer_create(name=f"Customer {c}")
            adjustment_create(staff=staff, customer=customer, asset_code="JPY", amount=10_000, direction="credit", reason="bench")
            for p in range(payments):
                payment_create(terminal=tills[p % len(tills)], customer=customer, asset_code="JPY", amount=100 + p)


def phase_create(args: argparse.Namespace) -> None:
    from django.core.management import call_command
    from django.db import connection

    from devtools.demo_seed import platform_ensure
    from tenants.models import Tenant
    from tenants.services import tenant_create

    started = time.perf_counter()
    call_command("migrate_schemas", "--shared", interactive=False, verbosity=0)
    platform_ensure(public_domain="bench-tenants.localhost")
    connection.set_schema_to_public()
    existing = Tenant.objects.filter(schema_name__startswith=PREFIX).count()
    emit(phase="create", figure="setup_s", value=round(time.perf_counter() - started, 2), existing_tenants=existing)
    creation: list[float] = []
    content: list[float] = []
    start, end = existing, args.tenants
    if args.create_range:
        start, end = (int(bound) for bound in args.create_range.split(":"))
    elif args.create_processes > 1 and end - start > 10:
        _create_in_processes(args, start, end - 10)
        start = end - 10
    for i in range(start, end):
        t0 = time.perf_counter()
        tenant_create(schema_name=schema_of(i), domain=f"{schema_of(i)}.bench.localhost", name=f"Bench {i}", main_currency="JPY")
        t1 = time.perf_counter()
        # The bench charges by customer id, as a tenant may allow (SPEC 4); the QR token is the default.
        Tenant.objects.filter(schema_name=schema_of(i)).update(charge_by_customer_id=True)
        tenant_content(schema=schema_of(i), terminals=args.terminals, customers=args.customers, payments=args.payments)
        connection.set_schema_to_public()
        t2 = time.perf_counter()
        creation.append(t1 - t0)
        content.append(t2 - t1)
        nth = i + 1
        if not args.create_range and (nth in MILESTONES or nth == args.tenants):
            window = creation[-10:]
            emit(phase="create", figure="tenant_create_s", nth=nth, value=round(t1 - t0, 3),
                 median_last_10_s=round(statistics.median(window), 3), content_s=round(t2 - t1, 3))
    if args.compare_django_tenants:
        compare_django_tenants(args.compare_django_tenants)
    if creation:
        emit(phase="create", figure="summary", created=len(creation), tenants=args.tenants,
             tenant_create_median_s=round(statistics.median(creation), 3), tenant_create_max_s=round(max(creation), 3),
             content_median_s=round(statistics.median(content), 3), wall_s=round(time.perf_counter() - started, 1))


def _create_in_processes(args: argparse.Namespace, start: int, end: int) -> None:
    """Tenants start..end-1 made by --create-processes processes of this script, each over a
    contiguous range (--create-range), at once."""
    count = args.create_processes
    bounds = [start + (end - start) * k // count for k in range(count + 1)]
    started = time.perf_counter()
    children = [
        subprocess.Popen([sys.executable, __file__, "--reuse", "--keep", "--phase", "create", "--db", args.db,
                          "--redis-url", args.redis_url, "--tenants", str(end), "--create-range", f"{low}:{high}",
                          "--terminals", str(args.terminals), "--customers", str(args.customers), "--payments", str(args.payments)],
                         cwd=ROOT, stdout=subprocess.DEVNULL)
        for low, high in itertools.pairwise(bounds)
    ]
    if any(child.wait() != 0 for child in children):
        raise SystemExit("a creating process failed")
    wall = time.perf_counter() - started
    emit(phase="create", figure="created_in_processes", processes=count, tenants=end - start,
         wall_s=round(wall, 1), per_tenant_s=round(wall / max(1, end - start), 3))


def compare_django_tenants(count: int) -> None:
    """Tenants created at this tenant count by django-tenants' own clone (its clone_schema),
    timed, then removed: the reference the clone in tenants.schemas replaced."""
    from django.db import connection
    from django_tenants.models import TenantMixin

    from tenants.models import Tenant
    from tenants.services import tenant_create

    ours = Tenant.create_schema
    Tenant.create_schema = TenantMixin.create_schema  # type: ignore[method-assign]
    try:
        for k in range(count):
            schema = f"btdt{k}"
            t0 = time.perf_counter()
            tenant_create(schema_name=schema, domain=f"{schema}.bench.localhost", name=schema, main_currency="JPY")
            seconds = time.perf_counter() - t0
            connection.set_schema_to_public()
            emit(phase="create", figure="tenant_create_django_tenants_clone_s", tenants_before=_tenant_count() - 1, value=round(seconds, 3))
            Tenant.objects.filter(schema_name=schema).delete()
            with connection.cursor() as cursor:
                cursor.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        Tenant.create_schema = ours  # type: ignore[method-assign]


def _manage(args: argparse.Namespace, *command: str, **env: str) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=_env(args, **env), capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return round(time.perf_counter() - started, 2)


def _tenant_count() -> int:
    from tenants.models import Tenant

    return int(Tenant.objects.exclude(schema_name="public").count())


def phase_migrate(args: argparse.Namespace) -> None:
    schemas = _tenant_count()
    runs = {
        "skip_up_to_date": ["--tenant"],
        "standard_all": ["--tenant", "--all-tenants"],
        "multiprocessing_all": ["--tenant", "--all-tenants", "--executor=multiprocessing"],
    }
    for name, options in runs.items():
        if name not in args.migrate_runs.split(","):
            continue
        seconds = _manage(args, "migrate_schemas", "--noinput", "-v", "0", *options)
        emit(phase="migrate", figure="noop_migrate_schemas_s", run=name, schemas=schemas, value=seconds,
             per_schema_ms=round(1000 * seconds / schemas, 1))


def phase_column(args: argparse.Namespace) -> None:
    schemas = _tenant_count()
    column = {"TALLY_BENCH_COLUMN_MIGRATIONS": "bench.tenantcol.migrations_column"}
    for executor in args.column_executors.split(","):
        seconds = _manage(args, "migrate_schemas", "--noinput", "-v", "0", "--tenant", f"--executor={executor}", **column)
        emit(phase="column", figure="add_column_all_tenants_s", executor=executor, schemas=schemas, value=seconds,
             per_schema_ms=round(1000 * seconds / schemas, 1))
        if not args.column_rollback:
            continue
        seconds = _manage(args, "migrate_schemas", "tenantcol", "0001_initial", "--noinput", "-v", "0", "--tenant",
                          f"--executor={executor}", **column)
        emit(phase="column", figure="rollback_column_all_tenants_s", executor=executor, schemas=schemas, value=seconds)


def _postgres_ms(database: str) -> float:
    from bench.cpu_by_process import is_postgres, postgres_database, processes

    ticks = sum(t for t, command, _ in processes().values() if is_postgres(command) and postgres_database(command) == database)
    return ticks * 1000.0 / os.sysconf("SC_CLK_TCK")


def phase_beat(args: argparse.Namespace) -> None:
    from django.conf import settings
    from django.db import connection
    from django_celery_beat.models import PeriodicTask

    from config.celery import app

    app.loader.import_default_modules()
    connection.set_schema_to_public()
    entries: dict[str, dict[str, Any]] = {
        **{name: {"task": e["task"], "args": e.get("args", ()), "kwargs": e.get("kwargs", {}), "schedule_s": float(str(e["schedule"]))}
           for name, e in settings.CELERY_BEAT_SCHEDULE.items()},
        # Staff-edited entries (reconciliation's hourly fan-out); with eager tasks, each
        # tenant's run executes inline when its request commits.
        **{p.name: {"task": p.task, "args": json.loads(p.args or "[]"), "kwargs": json.loads(p.kwargs or "{}"),
                    "schedule_s": p.schedule.run_every.total_seconds() if p.interval_id else None}
           for p in PeriodicTask.objects.filter(enabled=True).exclude(task="celery.backend_cleanup")},
    }
    total_wall = total_cpu = total_pg = averaged = 0.0
    for name, entry in entries.items():
        task = app.tasks[str(entry["task"])]
        connection.set_schema_to_public()
        pg0, cpu0, t0 = _postgres_ms(args.db), time.process_time(), time.perf_counter()
        result = task.apply(args=entry["args"], kwargs=entry["kwargs"])
        wall, cpu, pg = time.perf_counter() - t0, time.process_time() - cpu0, _postgres_ms(args.db) - pg0
        if result.failed():
            raise SystemExit(f"beat entry {name} failed: {result.result!r}")
        total_wall, total_cpu, total_pg = total_wall + wall, total_cpu + cpu, total_pg + pg
        # Python and PostgreSQL CPU spread over the entry's period, as % of one core.
        share = 100 * (cpu + pg / 1000) / entry["schedule_s"] if entry["schedule_s"] else None
        averaged += share or 0.0
        emit(phase="beat", figure="entry", entry=name, task=entry["task"], schedule_s=entry["schedule_s"],
             wall_s=round(wall, 3), python_cpu_s=round(cpu, 3), postgres_cpu_s=round(pg / 1000, 3),
             cpu_percent_averaged=None if share is None else round(share, 2))
    emit(phase="beat", figure="cycle", tenants=_tenant_count(), entries=len(entries),
         wall_s=round(total_wall, 3), python_cpu_s=round(total_cpu, 3), postgres_cpu_s=round(total_pg / 1000, 3),
         cpu_percent_averaged=round(averaged, 2))


def phase_idle(args: argparse.Namespace) -> None:
    from bench.cpu_by_process import is_postgres, postgres_database, processes
    from bench.harness import port_free, runner_start, stop, wait_ready

    if not port_free(PORT):
        raise SystemExit(f"port {PORT} in use")
    # Local settings (as `make run`), not the bench's: no eager tasks, no bench app.
    env = _env(args, DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING",
               PORT=str(PORT), VENV_BIN=str(ROOT / ".venv/bin"))
    runner = runner_start(env, ["web", "worker", "beat"])
    try:
        wait_ready(PORT, timeout=60, process=runner)
        time.sleep(args.idle_warmup)

        def label(pid: str, command: str, group: int) -> str | None:
            if int(pid) == runner.pid:  # supervisord
                return "runner"
            if is_postgres(command):
                return "postgres_backends" if postgres_database(command) == args.db else None
            if "redis-server" in command:
                return "redis_server_shared"
            for name, needle in (("web", "gunicorn"), ("worker", "celery -A config worker"), ("beat", "celery -A config beat")):
                if needle in command and _descends_from(pid, runner.pid):
                    return name
            return None

        before = processes()
        t0 = time.perf_counter()
        time.sleep(args.idle_seconds)
        after = processes()
        seconds = time.perf_counter() - t0
        tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
        spent: dict[str, float] = {}
        for pid, (ticks, command, group) in after.items():
            name = label(pid, command, group)
            if name is None:
                continue
            # A process born inside the window (a backend a task's connection opened) counts whole.
            spent[name] = spent.get(name, 0.0) + (ticks - (before[pid][0] if pid in before else 0)) * tick_ms
        platform = sum(v for k, v in spent.items() if k != "redis_server_shared")
        emit(phase="idle", figure="cpu_percent_of_one_core", tenants=_tenant_count(), seconds=round(seconds, 1),
             platform=round(100 * platform / 1000 / seconds, 2),
             **{k: round(100 * v / 1000 / seconds, 2) for k, v in sorted(spent.items())})
    finally:
        stop(runner, timeout=40)



def _descends_from(pid: str, ancestor: int) -> bool:
    from bench.cpu_by_process import parent_of

    current = int(pid)
    for _ in range(10):
        current = parent_of(current)
        if current == ancestor:
            return True
        if current <= 1:
            return False
    return False


def phase_session(args: argparse.Namespace) -> None:
    from django.db import connection, transaction

    from tenants.schemas import schema_clone
    from tenants.services import TEMPLATE_SCHEMA

    probe = f"{PREFIX}_session_probe"

    def clones(label: str, before: str = "") -> None:
        seconds = []
        for _ in range(2):
            connection.set_schema_to_public()
            with connection.cursor() as cursor:
                cursor.execute(f'DROP SCHEMA IF EXISTS "{probe}" CASCADE')
                if before:
                    cursor.execute(before)
            t0 = time.perf_counter()
            schema_clone(source=TEMPLATE_SCHEMA, target=probe)
            seconds.append(round(time.perf_counter() - t0, 3))
        with connection.cursor() as cursor:
            cursor.execute(f'DROP SCHEMA IF EXISTS "{probe}" CASCADE')
            cursor.execute("SELECT sum(total_bytes) / 1048576.0 FROM pg_backend_memory_contexts")
            (megabytes,) = cursor.fetchone()
        emit(phase="session", figure="clone_s", session=label, values=seconds, backend_mb=round(float(megabytes)))

    connection.close()
    clones("new")
    started = time.perf_counter()
    for i in range(min(args.session_tenants, _tenant_count())):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the foreign-key checks run now, then roll back
            tenant_content(schema=schema_of(i), terminals=1, customers=1, payments=0)
            transaction.set_rollback(True)
    emit(phase="session", figure="filled", tenants=args.session_tenants, seconds=round(time.perf_counter() - started, 1))
    clones(f"after writing to {args.session_tenants} tenants")
    clones("the same, DISCARD PLANS first", before="DISCARD PLANS")
    connection.close()
    clones("closed and opened again")


def phase_latency(args: argparse.Namespace) -> None:
    from django.core.handlers.wsgi import WSGIHandler
    from django.db import connection
    from django_tenants.utils import schema_context

    from bench.harness import wsgi_environ
    from tenants.models import Tenant
    from wallets.models import Customer, Terminal
    from wallets.services.principals import api_key_create

    schemas = sorted(Tenant.objects.filter(schema_name__startswith=PREFIX).values_list("schema_name", flat=True))
    first, last = schemas[0], schemas[-1]
    setup: dict[str, tuple[str, str, str]] = {}
    for schema in (first, last):
        with schema_context(schema):
            terminal = Terminal.objects.order_by("id").first()
            customer = Customer.objects.order_by("id").first()
            assert terminal is not None and customer is not None
            _, key = api_key_create(principal=terminal)
            setup[schema] = (f"{schema}.bench.localhost", key, customer.id)
        connection.set_schema_to_public()
    application = WSGIHandler()
    times: dict[str, list[float]] = {first: [], last: []}

    def pay(schema: str) -> float:
        host, key, customer = setup[schema]
        body = json.dumps({"customer": customer, "asset": "JPY", "amount": 1}).encode()
        environ = dict(wsgi_environ(body, key), HTTP_HOST=host)
        t0 = time.perf_counter()
        status = _served(application, environ)
        elapsed = time.perf_counter() - t0
        if not status.startswith("201"):
            raise SystemExit(f"payment in {schema}: {status}")
        return elapsed

    for schema in (first, last) * 20:  # warm-up: connection, caches, prepared statements
        pay(schema)
    for _ in range(args.latency_requests):
        for schema in (first, last):
            times[schema].append(pay(schema))

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    for label, schema in (("first", first), ("last", last)):
        emit(phase="latency", figure="keyed_payment_ms", tenant=label, schema=schema, tenants=_tenant_count(), how="in-process WSGI",
             requests=len(times[schema]), p50=pct(times[schema], 0.5), p99=pct(times[schema], 0.99))


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def _served(application: Any, environ: dict[str, Any]) -> str:
    """The status line of one request through the WSGI application, its body consumed."""
    status: list[str] = []
    for _ in application(environ, lambda line, headers, *exc: status.append(line)):
        pass
    return status[0] if status else ""


def memory_child(plan_file: str) -> None:
    """In a new process: one keyed payment in each tenant of the plan, through the WSGI application."""
    from django.core.handlers.wsgi import WSGIHandler

    from bench.harness import wsgi_environ

    plan = json.loads(Path(plan_file).read_text())
    rss = {"loaded_mb": _rss_mb()}
    application = WSGIHandler()
    for n, (host, key, customer) in enumerate(plan, start=1):
        body = json.dumps({"customer": customer, "asset": "JPY", "amount": 1}).encode()
        status = _served(application, dict(wsgi_environ(body, key), HTTP_HOST=host))
        if not status.startswith("201"):
            raise SystemExit(f"payment at {host}: {status}")
        if n == 1:
            rss["after_first_mb"] = _rss_mb()
    rss["after_last_mb"] = _rss_mb()
    from django.db import connection

    # The process's PostgreSQL backend keeps what it learnt of every tenant's catalog.
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(total_bytes), sum(total_bytes) FILTER (WHERE 'CacheMemoryContext' IN (name, parent))"
                       " FROM pg_backend_memory_contexts")
        total, caches = cursor.fetchone()
    rss["backend_memory_mb"] = round(int(total) / 2**20, 1)
    rss["backend_cache_memory_mb"] = round(int(caches) / 2**20, 1)
    print(json.dumps(rss))


def phase_memory(args: argparse.Namespace) -> None:
    from django.db import connection
    from django_tenants.utils import schema_context

    from tenants.models import Tenant
    from wallets.models import Customer, Terminal
    from wallets.services.principals import api_key_create

    schemas = sorted(Tenant.objects.filter(schema_name__startswith=PREFIX).values_list("schema_name", flat=True))
    step = max(1, len(schemas) // args.memory_tenants)
    plan = []
    for schema in schemas[::step][: args.memory_tenants]:
        with schema_context(schema):
            terminal = Terminal.objects.order_by("id").first()
            customer = Customer.objects.order_by("id").first()
            assert terminal is not None and customer is not None
            _, key = api_key_create(principal=terminal)
            plan.append((f"{schema}.bench.localhost", key, customer.id))
        connection.set_schema_to_public()
    plan_file = Path(f"/tmp/{args.db}_memory_plan.json")
    plan_file.write_text(json.dumps(plan))
    # config.settings.local's app, as a web worker runs it (the bench app and eager tasks of
    # bench.tenants_settings left out); the payments' relay kicks wait in Redis DB 15.
    code = f"import django; django.setup(); from bench.bench_tenants import memory_child; memory_child({str(plan_file)!r})"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env=_env(args, DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false"))
    plan_file.unlink()
    if result.returncode != 0:
        raise SystemExit(f"memory child failed:\n{result.stderr[-3000:]}")
    emit(phase="memory", figure="web_process_rss", tenants_served=len(plan), tenants=_tenant_count(),
         how="in-process WSGI, a new process", **json.loads(result.stdout.strip().splitlines()[-1]))


def phase_size(args: argparse.Namespace) -> None:
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relkind, count(*), sum(pg_relation_size(c.oid)), count(t.oid), sum(pg_total_relation_size(t.oid))
              FROM pg_class c LEFT JOIN pg_class t ON t.oid = c.reltoastrelid
             WHERE c.relnamespace = %s::regnamespace GROUP BY c.relkind
            """,
            [settings.TENANT_BASE_SCHEMA],
        )
        kinds = {kind: (count, int(size), toast, int(toast_size or 0)) for kind, count, size, toast, toast_size in cursor.fetchall()}
        cursor.execute("SELECT pg_database_size(current_database()), (SELECT count(*) FROM pg_class)")
        database_bytes, pg_class_rows = cursor.fetchone()
    names = {"r": "tables", "i": "indexes", "S": "sequences"}
    relations = {names.get(kind, kind): count for kind, (count, *_rest) in kinds.items()}
    toast_tables = sum(toast for _c, _s, toast, _ts in kinds.values())
    template_bytes = sum(size + toast_size for _c, size, _t, toast_size in kinds.values())
    emit(phase="size", figure="empty_tenant", schema=settings.TENANT_BASE_SCHEMA, relations=sum(relations.values()), **relations,
         toast_tables_and_their_indexes=2 * toast_tables, bytes=template_bytes, mb=round(template_bytes / 2**20, 2))
    emit(phase="size", figure="database", tenants=_tenant_count(), gb=round(database_bytes / 2**30, 2), pg_class_rows=pg_class_rows)


def phase_dump(args: argparse.Namespace) -> None:
    from django.conf import settings

    started = time.perf_counter()
    result = subprocess.run([str(Path(settings.TALLY_PG_BIN_DIR) / "pg_dump"), "--schema-only", "-f", "/dev/null",
                             f"postgres://postgres@127.0.0.1:5432/{args.db}"], capture_output=True, text=True)
    # A failure is a figure too: pg_dump locks every table it dumps, in one transaction.
    emit(phase="dump", figure="pg_dump_schema_only_s", tenants=_tenant_count(), value=round(time.perf_counter() - started, 1),
         ok=result.returncode == 0, error=result.stderr.strip()[-300:] if result.returncode else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--phase", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    parser.add_argument("--db", default="tally_bench_tenants", help="must start with tally_bench_tenants")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--reuse", action="store_true", help="keep the database and its tenants; create only the missing ones")
    parser.add_argument("--keep", action="store_true", help="leave the database for a later --reuse")
    parser.add_argument("--compare-django-tenants", type=int, default=0, metavar="K",
                        help="after creating, time K more tenants made by django-tenants' clone_schema (then removed)")
    parser.add_argument("--terminals", type=int, default=2)
    parser.add_argument("--customers", type=int, default=3)
    parser.add_argument("--payments", type=int, default=3, help="payments per customer")
    parser.add_argument("--column-executors", default="standard,multiprocessing")
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--idle-warmup", type=float, default=15)
    parser.add_argument("--latency-requests", type=int, default=300)
    parser.add_argument("--create-processes", type=int, default=1, help="create: processes that make all but the last ten")
    parser.add_argument("--create-range", default="", help=argparse.SUPPRESS)  # a creating process's start:end
    parser.add_argument("--migrate-runs", default="skip_up_to_date,standard_all,multiprocessing_all")
    parser.add_argument("--no-column-rollback", dest="column_rollback", action="store_false")
    parser.add_argument("--memory-tenants", type=int, default=1000)
    parser.add_argument("--session-tenants", type=int, default=600, help="session: tenants the session writes to")
    args = parser.parse_args()
    if not args.db.startswith("tally_bench_tenants"):
        raise SystemExit("--db must start with tally_bench_tenants")
    phases = [p for p in args.phase.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phase(s): {sorted(unknown)}")
    if "create" not in phases and not args.reuse:
        raise SystemExit("without the create phase, pass --reuse (a database an earlier --keep run left)")

    database_prepare(args)
    django_setup(args)
    try:
        for phase in PHASES:
            if phase in phases:
                started = time.perf_counter()
                globals()[f"phase_{phase}"](args)
                emit(phase=phase, figure="phase_wall_s", value=round(time.perf_counter() - started, 1))
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            import psycopg

            with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
