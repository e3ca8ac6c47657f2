"""Card top-ups through the saga against the real PSP simulator (0 ms latency), the cost the
saga adds over a plain internal credit, and the recovery time after the web process is
killed between the PSP's charge and the completion.

    .venv/bin/python bench/bench_topups.py --seconds 15 --threads 4 --pairs 300

1. Throughput: --threads threads, each its own connection, each a customer of its own,
   drive `POST /v1/customer/topups` (a fresh Idempotency-Key each) through the full stack
   in process (middleware, API-key auth, DRF, the idempotency engine's external path, the
   simulator over loopback HTTP) for --seconds; top-ups/s and p50/p99.
2. Added cost: one thread alternates a keyed top-up (saga) with a keyed staff credit
   `POST /v1/admin/adjustments` (an internal effect: one transaction) of the same amount,
   --pairs times; p50/p99 of each and the difference.
3. Recovery: gunicorn (1 worker) with the test pause after the PSP call, a top-up sent,
   the whole process group SIGKILLed once the PSP has charged, then the recovery pass run
   every 0.2 s until the record is completed. Reports the time from the kill to the
   recovered answer with a lease of --lease seconds, and the duration of the pass that
   recovered it. In production the wait is the lease (TALLY_TOPUP_LEASE_SECONDS, 30 s)
   plus up to one beat interval (10 s), plus that pass.

Own database (default tally_bench_topups), own tenant, Redis db 10.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A throwaway sealing ring (wallets/sealing.py) for this process and those it starts.
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))

SCHEMA = "bench_topup"
HOST = "bench-topup.localhost"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _setup(database_url: str, redis_url: str) -> None:
    os.environ.update(DATABASE_URL=database_url, REDIS_URL=redis_url, DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING",
                      TALLY_OUTBOX_RELAY_KICK="false", TALLY_THROTTLE_KEY_RATE="1000000/min", TALLY_THROTTLE_TENANT_RATE="10000000/min")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    from devtools.localservices import database_ensure

    database_ensure(database_url)
    import django

    django.setup()
    from django.core.management import call_command

    from devtools.demo_seed import platform_ensure

    call_command("migrate_schemas", "--shared", verbosity=0, interactive=False)
    platform_ensure(public_domain="bench-public.localhost")
    call_command("migrate_schemas", verbosity=0, interactive=False)


def _simulator() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "devtools.psp_simulator", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise SystemExit("simulator did not start")


def _fixtures(psp_url: str, customers: int) -> dict[str, Any]:
    from django_tenants.utils import schema_context

    from payments.services.topups import gateway_account_set
    from tenants.models import Tenant
    from tenants.services import tenant_create
    from wallets.services.principals import api_key_create, customer_create, staff_member_get_or_create

    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench top-ups", main_currency="JPY")
    with schema_context(SCHEMA):
        gateway_account_set(gateway="simulator", api_base=psp_url, secret_key=f"sk_sim_{uuid.uuid4().hex}", webhook_secrets=["whsec_b"])
        staff = staff_member_get_or_create(username=f"bench-{uuid.uuid4().hex[:6]}")
        people = [customer_create(name=f"Bench {i}") for i in range(customers)]
        return {
            "staff_key": api_key_create(principal=staff)[1],
            "customers": [(c, api_key_create(principal=c)[1]) for c in people],
        }


def _post(client: Any, path: str, key: str, body: dict[str, Any]) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)


def _throughput(fx: dict[str, Any], seconds: float, threads: int) -> dict[str, float]:
    from django.db import connections
    from django.test import Client

    latencies: list[float] = []
    errors: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        _, key = fx["customers"][i]
        client = Client(HTTP_HOST=HOST)
        mine: list[float] = []
        try:
            while time.monotonic() < stop:
                started = time.perf_counter()
                r = _post(client, "/v1/customer/topups", key, {"asset": "JPY", "amount": 100, "payment_method": "pm_card_visa"})
                mine.append(time.perf_counter() - started)
                if r.status_code != 201:
                    errors.append(r.status_code)
        finally:
            connections.close_all()
        with lock:
            latencies.extend(mine)

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - started
    return {"topups": len(latencies), "per_second": len(latencies) / elapsed, "p50_ms": _pct(latencies, 0.5),
            "p99_ms": _pct(latencies, 0.99), "errors": len(errors)}


def _added_cost(fx: dict[str, Any], pairs: int) -> dict[str, float]:
    from django.test import Client

    client = Client(HTTP_HOST=HOST)
    customer, key = fx["customers"][-1]
    saga: list[float] = []
    internal: list[float] = []
    for _ in range(pairs):
        t0 = time.perf_counter()
        r = _post(client, "/v1/customer/topups", key, {"asset": "JPY", "amount": 100, "payment_method": "pm_card_visa"})
        t1 = time.perf_counter()
        a = _post(client, "/v1/admin/adjustments", fx["staff_key"],
                  {"customer": customer.pk, "asset": "JPY", "amount": 100, "direction": "credit", "reason": "bench"})
        t2 = time.perf_counter()
        assert r.status_code == 201 and a.status_code == 201, (r.content, a.content)
        saga.append(t1 - t0)
        internal.append(t2 - t1)
    return {
        "saga_p50": _pct(saga, 0.5), "saga_p99": _pct(saga, 0.99), "internal_p50": _pct(internal, 0.5), "internal_p99": _pct(internal, 0.99),
        "added_p50": _pct(saga, 0.5) - _pct(internal, 0.5), "added_p99": _pct(saga, 0.99) - _pct(internal, 0.99),
    }


def _recovery(fx: dict[str, Any], database_url: str, redis_url: str, psp_url: str, lease: int) -> dict[str, float]:
    from django.db import connection
    from django_tenants.utils import schema_context

    from idempotency.models import IdempotencyRecord
    from payments.services.topup_saga import topup_recovery_run
    from wallets.models import LedgerTransaction

    customer, key = fx["customers"][0]
    port = _free_port()
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", PORT=str(port), WEB_CONCURRENCY="1", TALLY_TOPUP_LEASE_SECONDS=str(lease),
               TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS="60", DATABASE_URL=database_url, REDIS_URL=redis_url)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    web = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py")],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        idem = uuid.uuid4().hex
        body = json.dumps({"asset": "JPY", "amount": 777, "payment_method": "pm_card_visa"}).encode()
        head = (f"POST /v1/customer/topups HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {key}\r\nIdempotency-Key: {idem}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        sock.sendall(head + body)
        with schema_context(SCHEMA):
            deadline = time.monotonic() + 60
            while not IdempotencyRecord.objects.filter(principal_id=customer.pk, key=idem, minted__has_key="topup").exists():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            record = IdempotencyRecord.objects.get(principal_id=customer.pk, key=idem)
            topup_id = record.minted["topup"]
            sim_key = None
            while sim_key is None:  # the PSP has charged it
                state = json.loads(urllib.request.urlopen(psp_url + "/_control/state", timeout=5).read())
                for acct in state["accounts"].values():
                    if any(c["idempotency_key"] == topup_id for c in acct["charges"]):
                        sim_key = "found"
                time.sleep(0.05)
            os.killpg(web.pid, signal.SIGKILL)
            killed = time.monotonic()
            sock.close()
            last_pass = 0.0
            while True:
                t0 = time.monotonic()
                topup_recovery_run()
                last_pass = time.monotonic() - t0
                if IdempotencyRecord.objects.filter(pk=record.pk, state="completed").exists():
                    break
                time.sleep(0.2)
            recovered = time.monotonic() - killed
            credits = LedgerTransaction.objects.filter(kind="topup", reference=topup_id).count()
            connection.close()
        return {"kill_to_recovered_s": recovered, "recovering_pass_ms": last_pass * 1000, "credits": credits, "lease_s": lease}
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)
        web.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--lease", type=int, default=2)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_topups")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    args = parser.parse_args()
    _setup(args.database_url, args.redis_url)
    sim, psp_url = _simulator()
    try:
        fx = _fixtures(psp_url, customers=max(args.threads, 1) + 1)
        from django_tenants.utils import schema_context

        with schema_context(SCHEMA):
            from django.db import connection

            connection.set_schema(SCHEMA)
            tp = _throughput(fx, args.seconds, args.threads)
            print(f"throughput: {tp['topups']} top-ups in {args.seconds:.0f} s with {args.threads} threads: "
                  f"{tp['per_second']:.1f}/s, p50 {tp['p50_ms']:.2f} ms, p99 {tp['p99_ms']:.2f} ms, errors {tp['errors']}", flush=True)
            cost = _added_cost(fx, args.pairs)
            print(f"added cost over {args.pairs} pairs (ms): saga p50 {cost['saga_p50']:.2f} p99 {cost['saga_p99']:.2f}; "
                  f"internal credit p50 {cost['internal_p50']:.2f} p99 {cost['internal_p99']:.2f}; "
                  f"added p50 {cost['added_p50']:.2f} p99 {cost['added_p99']:.2f}", flush=True)
        rec = _recovery(fx, args.database_url, args.redis_url, psp_url, args.lease)
        print(f"recovery: lease {rec['lease_s']} s, kill -> recovered answer {rec['kill_to_recovered_s']:.2f} s, "
              f"recovering pass {rec['recovering_pass_ms']:.1f} ms, credits {rec['credits']}", flush=True)
    finally:
        sim.terminate()
        sim.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
