"""Scheduled payouts at scale: one beat run of `payouts_scheduled_run` (payments/services/payouts.py)
for N merchants on a daily schedule, each with available funds and a bank account, against
the PSP simulator answering every call after --latency-ms.

    .venv/bin/python bench/bench_payouts.py --merchants 10000 --latency-ms 50 --concurrency 16

The run makes one payout per merchant (its whole available balance: a lock of its balance
rows, the move to payouts in transit, the row and its event, one transaction each) and
sends each to the PSP under its id (lease, the call, the fenced completion), from
--concurrency threads. Reports the run's wall time, the CPU of this process (the run
itself), of PostgreSQL's backends of the bench database (sampled from /proc every 0.2 s)
and of the simulator, and the outcomes. Funds are posted again before each run (dated
three days back: available), and each run pays out a schedule day of its own, so runs can
be repeated on the kept data (--reuse).

Own database (default tally_bench_payouts), own tenant, Redis db 9.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from datetime import date, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TALLY_SEALING_KEYS", "bench1:YmVuY2gtc2VhbGluZy1rZXktMDAwMDAwMDAwMDAwMDA=")
sys.path.insert(0, str(ROOT))

from bench.bench_topups import _free_port, _setup  # noqa: E402 - after the path
from bench.cpu_by_process import cpu_ms, postgres_database, processes  # noqa: E402

SCHEMA = "bench_payout"
HOST = "bench-payout.localhost"
FUNDS = 10_000
BATCH = 500


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


def _faults(url: str, **faults: Any) -> None:
    request = urllib.request.Request(url + "/_control/faults", data=json.dumps(faults).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()


def _seed(merchants: int) -> None:
    """N merchants on a daily schedule with a merchant account (JPY rows only), made in bulk."""
    from django_tenants.utils import schema_context

    from tenants.models import Tenant
    from tenants.services import tenant_create
    from wallets.models import Account, AccountKind, Merchant
    from wallets.services.ledger import balance_rows_create

    if not Tenant.objects.filter(schema_name=SCHEMA).exists():
        tenant_create(schema_name=SCHEMA, domain=HOST, name="Bench payouts", main_currency="JPY")
    with schema_context(SCHEMA):
        missing = merchants - Merchant.objects.filter(payout_schedule="daily").count()
        for start in range(0, max(missing, 0), 2000):
            made = Merchant.objects.bulk_create(
                [Merchant(name=f"Bench payee {start + i}", payout_schedule="daily") for i in range(min(2000, missing - start))]
            )
            accounts = Account.objects.bulk_create([Account(kind=AccountKind.MERCHANT, merchant=m) for m in made])
            balance_rows_create(accounts=accounts, asset_codes=["JPY"])
            print(f"seeded {start + len(made)} of {missing} merchants", flush=True)


def _prepare(psp_url: str) -> date:
    """This run's gateway and bank account at the (new) simulator, the merchants' funds, and
    a schedule day no run has used."""
    from django.db import transaction
    from django.db.models import Max
    from django.utils import timezone
    from django_tenants.utils import schema_context

    from payments.gateways.simulator import SimulatorGateway
    from payments.models import MerchantBankAccount, Payout
    from payments.services.topups import gateway_account_set
    from wallets.models import Account, Merchant, SystemRole
    from wallets.selectors import system_account_get
    from wallets.services.ledger import Leg, ledger_post

    key = f"sk_sim_{uuid.uuid4().hex}"
    with schema_context(SCHEMA):
        gateway_account_set(gateway="simulator", api_base=psp_url, secret_key=key, webhook_secrets=["whsec_b"])
        bank = SimulatorGateway(api_base=psp_url, secret_key=key, timeout=10).bank_account_attach(token="btok_bank", reference="bench")
        ids = list(Merchant.objects.filter(payout_schedule="daily").values_list("pk", flat=True))
        MerchantBankAccount.objects.filter(merchant_id__in=ids).delete()
        MerchantBankAccount.objects.bulk_create([
            MerchantBankAccount(merchant_id=pk, gateway="simulator", psp_reference=bank.psp_reference, last4=bank.last4,
                                changed_at=timezone.now() - timedelta(days=8))
            for pk in ids
        ], batch_size=2000)
        adjustments = system_account_get(role=SystemRole.ADJUSTMENTS)
        accounts = list(Account.objects.filter(merchant_id__in=ids))
        for start in range(0, len(accounts), BATCH):
            batch = accounts[start : start + BATCH]
            with transaction.atomic():
                ledger_post(kind="adjustment", reference=f"adj_bench_{uuid.uuid4().hex[:12]}", created=timezone.now() - timedelta(days=3),
                            legs=[Leg(adjustments, "JPY", -FUNDS * len(batch)), *(Leg(a, "JPY", FUNDS) for a in batch)])
        last = Payout.objects.aggregate(day=Max("schedule_day"))["day"]
        return (last + timedelta(days=1)) if last else timezone.now().date()


class PostgresCpu:
    """CPU of the bench database's backends, sampled: a backend that closes between two
    samples keeps what the last sample saw of it."""

    def __init__(self, database: str) -> None:
        self.database, self.seen, self.start = database, {}, {}  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.start = self._sample()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _sample(self) -> dict[str, int]:
        return {pid: ticks for pid, (ticks, command, _) in processes().items() if postgres_database(command) == self.database}

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            self.seen.update(self._sample())

    def ms(self) -> float:
        self.stop.set()
        self.thread.join()
        self.seen.update(self._sample())
        ticks = sum(t - self.start.get(pid, 0) for pid, t in self.seen.items())
        return ticks * 1000.0 / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merchants", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=int, default=50, help="the simulator's latency on every call")
    parser.add_argument("--concurrency", type=int, default=16, help="threads sending payouts (TALLY_PAYOUT_SUBMIT_CONCURRENCY)")
    parser.add_argument("--database", default="tally_bench_payouts")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    database_url = f"postgres://postgres@127.0.0.1:5432/{args.database}"
    _setup(database_url, args.redis)
    sim, psp_url = _simulator()
    try:
        _seed(args.merchants)
        day = _prepare(psp_url)
        _faults(psp_url, latency_ms=args.latency_ms, payouts_manual=True)
        from django.db import connections
        from django_tenants.utils import schema_context

        from payments.models import Payout
        from payments.services.payouts import payouts_scheduled_run

        connections.close_all()
        postgres = PostgresCpu(args.database)
        sim_before, self_before = cpu_ms(sim.pid), resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        with schema_context(SCHEMA):
            counts = payouts_scheduled_run(day=day, concurrency=args.concurrency)
        wall = time.monotonic() - started
        self_after = resource.getrusage(resource.RUSAGE_SELF)
        python_ms = (self_after.ru_utime + self_after.ru_stime - self_before.ru_utime - self_before.ru_stime) * 1000
        with schema_context(SCHEMA):
            made = Payout.objects.filter(schedule_day=day).count()
        print(json.dumps({
            "merchants": args.merchants, "latency_ms": args.latency_ms, "concurrency": args.concurrency, "payouts": made,
            "outcomes": counts, "wall_s": round(wall, 1), "payouts_per_s": round(made / wall, 1),
            "cpu_python_s": round(python_ms / 1000, 1), "cpu_postgres_s": round(postgres.ms() / 1000, 1),
            "cpu_simulator_s": round((cpu_ms(sim.pid) - sim_before) / 1000, 1),
            "cpu_python_ms_per_payout": round(python_ms / max(made, 1), 2),
        }, indent=1))
    finally:
        sim.terminate()
        sim.wait(timeout=10)


if __name__ == "__main__":
    main()
