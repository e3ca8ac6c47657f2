"""`make run`'s demo payout, end to end: the seed gives the demo merchant a bank account at
the simulator (held from the simulator's start, through its accounts file), a daily
schedule and an available opening balance; the scheduled run pays it out, the simulator
reports it paid with a signed webhook, and the payout ends `paid` with its `payout.paid`
event for the merchant's webhook endpoint. Seeding again changes nothing. And the banner's
promise holds: under `make run`'s environment beat first sends that run as soon as the
banner says, within a minute of its start (not the production default's hour)."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from django.db import connection
from django.test import Client
from django_tenants.utils import schema_context

from devtools import run
from devtools.demo_seed import DEMO_DOMAIN, DEMO_SCHEMA, demo_psp_ensure, demo_seed
from payments.models import OutboxEvent, Payout
from payments.services.payouts import payouts_scheduled_run
from tests.receivers import free_port, process_stop, receiver_running
from wallets.models import Merchant
from wallets.selectors import merchant_funds

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_merchant_is_paid_out_daily_and_the_payout_reaches_paid(django_db_setup: None, django_db_blocker: Any, tmp_path: Path) -> None:
    with django_db_blocker.unblock(), receiver_running() as receiver:
        seeded = demo_seed(keys_file=tmp_path / "keys.json")
        merchant_id = seeded["ids"]["merchant"]
        port, state = free_port(), tmp_path / "psp.json"
        for _ in range(2):  # a second seed changes nothing
            demo_psp_ensure(psp_url=f"http://127.0.0.1:{port}", webhook_url=receiver.url(), state_file=state, merchant_id=merchant_id)
        sim = subprocess.Popen([sys.executable, "-m", "devtools.psp_simulator", "--port", str(port), "--accounts-file", str(state)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            with schema_context(DEMO_SCHEMA):
                # Its opening ¥30,000 and what the demo history's shoppers paid it (days back: available).
                funds = {f.asset_code: f for f in merchant_funds(merchant=Merchant.objects.get(pk=merchant_id))}
                assert funds["JPY"].available > 30_000
                assert payouts_scheduled_run(concurrency=1).get("in_transit") == 1
                payout = Payout.objects.get(merchant_id=merchant_id, origin="scheduled")
                assert payout.amount == funds["JPY"].available and payout.status == "in_transit" and payout.destination_last4 == "6789"
            while not any(b"payout.paid" in r.body for r in receiver.requests):
                assert time.monotonic() < deadline + 20, "the simulator never reported the payout paid"
                time.sleep(0.05)
            paid = next(r for r in receiver.requests if b"payout.paid" in r.body)
            answer = Client(HTTP_HOST=DEMO_DOMAIN).post("/v1/psp/webhooks/simulator", data=paid.body, content_type="application/json",
                                                        HTTP_PSP_SIGNATURE=paid.headers["Psp-Signature"])
            assert answer.status_code == 200 and answer.json()["outcome"] == "applied"
            with schema_context(DEMO_SCHEMA):
                assert Payout.objects.get(pk=payout.pk).status == "paid"
                assert OutboxEvent.objects.filter(object_id=payout.pk, topic="payout.paid", payload__merchant=merchant_id).exists()
                assert payouts_scheduled_run(concurrency=1) in ({}, {"nothing_to_pay": 1})  # once a day
        finally:
            process_stop(sim, timeout=5)
            connection.set_schema_to_public()


# Beat's scheduled-payouts entry as a freshly started beat holds it, and the banner line,
# both from the settings of a process started with `make run`'s environment. (Beat's
# DatabaseScheduler stores the same entry, its interval updated from the settings at each
# start, and starts a new entry's clock when it is created, as this one does; an entry
# that ran before is due at once when its last run is older than the interval.)
_BEAT_PROBE = """
import json
import django
django.setup()
from celery.beat import ScheduleEntry
from django.conf import settings
from config.celery import app
from devtools.run import payouts_banner_line
entry = ScheduleEntry(name="payouts-scheduled", app=app, **app.conf.beat_schedule["payouts-scheduled"])
due, first_in = entry.is_due()
banner = payouts_banner_line(schedule_seconds=int(settings.TALLY_PAYOUT_SCHEDULE_SECONDS))
print(json.dumps({"task": entry.task, "due_at_start": due, "first_in": first_in, "banner": banner}))
"""


def test_make_run_s_beat_pays_out_as_soon_as_its_banner_promises() -> None:
    """The banner promises the demo payout within N s of beat's start. Under `make run`'s
    environment (the caller's TALLY_PAYOUT_SCHEDULE_SECONDS left out, as a newcomer has
    none) a fresh beat first sends the scheduled-payouts run within those N s, and N is
    under a minute: with the production default, an hour, the newcomer would wait an hour
    for what the banner says is coming."""
    env = {name: value for name, value in os.environ.items() if name != "TALLY_PAYOUT_SCHEDULE_SECONDS"}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.local"  # as run.main sets it
    run.run_defaults_apply(env)
    probe = subprocess.run([sys.executable, "-c", _BEAT_PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    promise = re.search(r"within (\d+) s of beat's start", found["banner"])
    assert promise, found["banner"]
    assert found["task"] == "payments.payouts_scheduled_all_tenants"
    assert not found["due_at_start"] and 0 < found["first_in"] <= int(promise.group(1)) <= 60, found
    # run.main gives its processes that environment before the settings load (its banner reads them).
    source = inspect.getsource(run.main)
    assert source.index("run_defaults_apply(os.environ)") < source.index("django.setup()") < source.index("payouts_banner_line(")
