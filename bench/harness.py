"""What the payment benchmarks share: the bench tenant and its keys, the environment of
the processes they start, starting and stopping those processes, and the keyed-payment load.

bench_http.py, bench_request_cpu.py, bench_outbox.py, bench_webhooks.py and bench_tenants.py
import it and keep only what they measure: each puts the repository root on `sys.path`, then
imports from here. Importing this module sets a throwaway sealing ring (TALLY_SEALING_KEYS)
for the process and those it starts.

`seed()` makes (once) and reuses, in the database given: the bench tenant `benchhttp`
(charging by customer id, as a tenant may allow), 2,000 funded customers, 200 merchants
with one terminal each (spread traffic) and one hot merchant with 16 terminals (hot
traffic), and mints fresh terminal keys on every run.
"""

from __future__ import annotations

import http.client
import io
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")

SCHEMA = "benchhttp"
DOMAIN = "benchhttp.localhost"
SPREAD_MERCHANTS = 200
HOT_TERMINALS = 16
CUSTOMERS = 2_000
START_BALANCE = 10**12


def bench_env(database_url: str, redis_url: str) -> dict[str, str]:
    """This process's environment with the production settings on the bench's database and Redis."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="config.settings.production",
        DJANGO_SECRET_KEY="bench-" + "x" * 50,
        DJANGO_ALLOWED_HOSTS="*",
        # Production requires the contact keys; any valid Fernet key will do here.
        TALLY_CONTACT_ENCRYPTION_KEYS=env.get("TALLY_CONTACT_ENCRYPTION_KEYS") or "YmVuY2gta2V5LWJlbmNoLWtleS1iZW5jaC1rZXktMDE=",
        TALLY_CONTACT_HASH_KEY=env.get("TALLY_CONTACT_HASH_KEY") or "bench-hash-" + "h" * 40,
        TALLY_LOG_LEVEL="WARNING",
        # Measure the API, not the rate limiter's refusals (its Redis round trip still counts).
        TALLY_THROTTLE_KEY_RATE="1000000/min",
        TALLY_THROTTLE_TENANT_RATE="10000000/min",
        # Webhook receivers on 127.0.0.1 (bench_outbox, bench_webhooks, bench_http --stack make-run), as under `make run`.
        TALLY_WEBHOOK_ALLOW_HTTP="true",
        TALLY_WEBHOOK_ALLOW_LOOPBACK="true",
    )
    return env


def bench_database_open(*, db: str, fresh: bool, redis_url: str) -> bool:
    """Make the bench's own database (again with `fresh`), point this process's production
    settings at it, set Django up and migrate it. Returns whether it must be loaded (new)."""
    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone() is not None
        if fresh or not exists:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{db}"')
    os.environ.update(bench_env(f"postgres://postgres@127.0.0.1:5432/{db}", redis_url))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate_schemas", interactive=False, verbosity=0)
    return fresh or not exists


def seed(database_url: str, redis_url: str) -> dict[str, Any]:
    """Tenant, parties and fresh keys; returns the keys and customer ids for the clients."""
    os.environ.update(bench_env(database_url, redis_url))
    from devtools.localservices import database_ensure

    database_ensure(database_url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from django_tenants.utils import schema_context

    from tenants.models import Tenant
    from tenants.services import tenant_create
    from wallets.models import Account, AccountKind, Customer, Merchant, Store, SystemRole, Terminal
    from wallets.services.ledger import Leg, balance_rows_create, ledger_post
    from wallets.services.principals import api_key_create

    call_command("migrate_schemas", verbosity=0, interactive=False)
    connection.set_schema_to_public()
    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain=DOMAIN, name="Bench HTTP", main_currency="JPY")
    # The bench charges by customer id, as a tenant may allow (SPEC 4); the QR token is the default.
    Tenant.objects.filter(schema_name=SCHEMA).update(charge_by_customer_id=True)
    with schema_context(SCHEMA):
        if not Merchant.objects.filter(name="Hot merchant").exists():
            with transaction.atomic():
                merchants = Merchant.objects.bulk_create([Merchant(name=f"Spread merchant {i}") for i in range(SPREAD_MERCHANTS)])
                hot = Merchant.objects.create(name="Hot merchant")
                Account.objects.bulk_create([Account(kind=AccountKind.MERCHANT, merchant=m) for m in [*merchants, hot]])
                stores = Store.objects.bulk_create([Store(merchant=m, name="Store") for m in merchants])
                Terminal.objects.bulk_create([Terminal(store=s, name="Till") for s in stores])
                hot_store = Store.objects.create(merchant=hot, name="Flagship")
                Terminal.objects.bulk_create([Terminal(store=hot_store, name=f"Till {i}") for i in range(HOT_TERMINALS)])
                customers = Customer.objects.bulk_create([Customer(name=f"Bench customer {i}") for i in range(CUSTOMERS)])
                accounts = Account.objects.bulk_create([Account(kind=AccountKind.CUSTOMER, customer=c) for c in customers])
                source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
                legs = [Leg(a, "JPY", START_BALANCE) for a in accounts] + [Leg(source, "JPY", -START_BALANCE * len(accounts))]
                ledger_post(kind="adjustment", reference="bench_http_funding", legs=legs)
        # Accounts made in bulk above skip the service that gives them their balance rows.
        balance_rows_create(accounts=Account.objects.all())
        spread = [api_key_create(principal=t)[1] for t in Terminal.objects.exclude(store__merchant__name="Hot merchant")]
        hot_keys = [api_key_create(principal=t)[1] for t in Terminal.objects.filter(store__merchant__name="Hot merchant")]
        customer_ids = list(Customer.objects.values_list("id", flat=True)[:CUSTOMERS])
    return {"spread": spread, "hot": hot_keys, "customers": customer_ids}


def wsgi_environ(body: bytes, key: str) -> dict[str, Any]:
    """What gunicorn's sync worker hands the application for a keyed `POST /v1/terminal/payments`."""
    return {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/v1/terminal/payments", "QUERY_STRING": "",
        "RAW_URI": "/v1/terminal/payments", "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
        "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "50000",
        "HTTP_HOST": DOMAIN, "HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex,
        "HTTP_USER_AGENT": "bench_request_cpu", "HTTP_ACCEPT": "*/*",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
        "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }


# --- The load: keyed payments over loopback HTTP ------------------------------------------------


def _client_process(port: int, keys: list[str], customers: list[str], threads: int, seconds: float, out: Any) -> None:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        local: list[float] = []
        local_status: dict[int, int] = {}
        while time.monotonic() < deadline:
            body = json.dumps({"customer": rnd.choice(customers), "asset": "JPY", "amount": rnd.randint(1, 5000)})
            headers = {
                "Host": DOMAIN, "Authorization": f"Bearer {rnd.choice(keys)}", "Idempotency-Key": uuid.uuid4().hex,
                "Content-Type": "application/json",
            }
            started = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", "/v1/terminal/payments", body=body, headers=headers)
                status = conn.getresponse().status
            except OSError:
                status = 0
            finally:
                conn.close()
            local.append(time.perf_counter() - started)
            local_status[status] = local_status.get(status, 0) + 1
        with lock:
            latencies.extend(local)
            for k, v in local_status.items():
                statuses[k] = statuses.get(k, 0) + v

    pool = [threading.Thread(target=worker, args=(os.getpid() * 1000 + i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put({"latencies": latencies, "statuses": statuses})


def drive(port: int, keys: list[str], customers: list[str], *, clients: int, seconds: float, processes: int = 2) -> dict[str, Any]:
    queue: Any = multiprocessing.Queue()
    per = max(1, clients // processes)
    procs = [multiprocessing.Process(target=_client_process, args=(port, keys, customers, per, seconds, queue)) for _ in range(processes)]
    started = time.monotonic()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.monotonic() - started
    latencies = sorted(x for r in results for x in r["latencies"])
    statuses: dict[int, int] = {}
    for r in results:
        for k, v in r["statuses"].items():
            statuses[int(k)] = statuses.get(int(k), 0) + v
    ok = statuses.get(201, 0)

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else 0.0

    return {"payments_per_s": round(ok / elapsed, 1), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "statuses": statuses, "seconds": round(elapsed, 1)}


_WRK_SCRIPT = """
local keys = {%(keys)s}
local customers = {%(customers)s}
local counter = 0
local tid = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end
function init(args)
  math.randomseed(os.time() * 1000 + tid)
end
function request()
  counter = counter + 1
  local body = string.format('{"customer":"%%s","asset":"JPY","amount":%%d}', customers[math.random(#customers)], math.random(1, 5000))
  local headers = {
    ["Host"] = "%(host)s",
    ["Authorization"] = "Bearer " .. keys[math.random(#keys)],
    ["Idempotency-Key"] = string.format("wrk-%%d-%%d-%%d-%%d", os.time(), tid, counter, math.random(1000000000)),
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/v1/terminal/payments", headers, body)
end
"""


def drive_wrk(port: int, keys: list[str], customers: list[str], *, clients: int, seconds: float) -> dict[str, Any]:
    """The same traffic from wrk (C, two threads): the load generator then costs the two
    cores far less than Python clients do. Sync gunicorn closes each connection; wrk reconnects."""
    if shutil.which("wrk") is None:
        raise SystemExit("--driver wrk needs wrk (Debian package wrk)")
    script = _WRK_SCRIPT % {
        "keys": ",".join(f'"{k}"' for k in keys), "customers": ",".join(f'"{c}"' for c in customers), "host": DOMAIN,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{int(seconds)}s", "--latency", "-s", f.name, f"http://127.0.0.1:{port}/v1/terminal/payments"],
        capture_output=True, text=True, check=True,
    ).stdout
    os.unlink(f.name)

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([0-9.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return 0.0
        value, unit = float(m.group(1)), m.group(2)
        return round(value / 1000 if unit == "us" else value * 1000 if unit == "s" else value, 1)

    total = int(re.search(r"([0-9]+) requests in", out).group(1))  # type: ignore[union-attr]
    duration = float(re.search(r"requests in ([0-9.]+)s", out).group(1))  # type: ignore[union-attr]
    bad_match = re.search(r"Non-2xx or 3xx responses: ([0-9]+)", out)
    bad = int(bad_match.group(1)) if bad_match else 0
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "payments_per_s": round((total - bad) / duration, 1), "p50_ms": ms("50%"), "p99_ms": ms("99%"),
        "statuses": {"2xx": total - bad, "other": bad}, "socket_errors": errors.group(1) if errors else "", "seconds": duration,
    }


# --- The processes a bench starts ---------------------------------------------------------------


def wait_ready(
    port: int, timeout: float = 30, process: subprocess.Popen[bytes] | None = None, *, path: str = "/healthz", host: str | None = DOMAIN
) -> None:
    """Until `GET path` on 127.0.0.1:`port` answers 200 (Host: `host`, or the address when None);
    RuntimeError after `timeout` seconds, or once `process` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited before it was ready (exit code {process.returncode})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path, headers={"Host": host} if host else {})
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing answered {path} on port {port} within {timeout:.0f} s")


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As the servers bind: connections of an earlier run left in TIME_WAIT do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop(*processes: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM to each process's group, then SIGKILL to each still there after `timeout`."""
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# "sync" is config/gunicorn.py's own worker. gthread is measured as gunicorn ships it, one
# thread: no request here meets gunicorn's own errors, which the envelope worker rewrites.
WORKER_ARGS = {"sync": [], "gthread": ["--worker-class", "gthread", "--threads", "1"]}


def gunicorn_start(env: dict[str, str], port: int, workers: int, worker_class: str = "sync") -> subprocess.Popen[bytes]:
    """gunicorn with config/gunicorn.py and `workers` workers, once it answers /healthz."""
    env = dict(env, PORT=str(port), WEB_CONCURRENCY=str(workers))
    server = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py"), *WORKER_ARGS[worker_class]],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_ready(port)
    except BaseException:
        stop(server)
        raise
    return server


def platform_start(
    env: dict[str, str], *, port: int, workers: int, celery_concurrency: int, beat_schedule: str
) -> dict[str, subprocess.Popen[bytes]]:
    """gunicorn, a Celery worker and Celery beat, each in a session of its own (stop them with
    `stop(*processes.values())`), once gunicorn answers."""
    env = dict(env, PORT=str(port), WEB_CONCURRENCY=str(workers))
    bin_dir = ROOT / ".venv/bin"
    commands = {
        "web": [str(bin_dir / "gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py")],
        "worker": [str(bin_dir / "celery"), "-A", "config", "worker", "--loglevel", "WARNING", "--concurrency", str(celery_concurrency)],
        "beat": [str(bin_dir / "celery"), "-A", "config", "beat", "--loglevel", "WARNING", "-s", beat_schedule],
    }
    processes = {
        name: subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for name, command in commands.items()
    }
    try:
        wait_ready(port)
    except BaseException:
        stop(*processes.values())
        raise
    return processes


# `make run`'s own runner (devtools.procfile) with the Procfile entries named, as `make run` starts them.
_RUNNER = (
    "import sys; from devtools.procfile import processes_run, procfile_read; from devtools.localservices import ROOT; "
    "names = sys.argv[1].split(','); "
    "raise SystemExit(processes_run([e for e in procfile_read(ROOT / 'Procfile') if e.name in names], cwd=ROOT))"
)


def runner_start(env: dict[str, str], names: list[str] | tuple[str, ...]) -> subprocess.Popen[bytes]:
    """`make run`'s runner with the Procfile entries `names`, in a session of its own; each
    entry it starts leads a session of its own."""
    return subprocess.Popen(
        [str(ROOT / ".venv/bin/python"), "-c", _RUNNER, ",".join(names)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
