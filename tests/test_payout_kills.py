"""Payouts under SIGKILL: the web process (which makes payouts, sends them to the PSP after
the commit and applies the PSP's webhooks) killed under load, first between the PSP's
answer and the completion, then at random moments while clients keep sending their keys;
then the process running the scheduled payouts killed mid-run. Afterwards the recovery
(as beat runs it) converges: every payout ends paid, failed or canceled, every client key
has its final answer and no 500, each payout's money moved once (to the PSP or back to
the merchant), the PSP holds at most one payout per payout of ours and agrees with us on
its end, and the in-transit account holds nothing of these payouts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from payments.models import Payout
from payments.selectors import payouts_in_transit_totals
from payments.services.payout_saga import payout_recovery_run
from tests.faults import figures
from tests.live import live_redis_env
from tests.payouts_support import PAYOUTS_TENANT, World, balance, ledger_kinds, system_balance
from tests.receivers import free_port
from wallets.models import Merchant, SystemRole
from wallets.services.principals import api_key_create

pytestmark = [pytest.mark.proof]

ROOT = Path(__file__).resolve().parent.parent
FINAL = (201, 402)


def _env(**extra: str) -> dict[str, str]:
    database = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false",
        DATABASE_URL=f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}",
        TENANT_CACHE_SECONDS="0", TALLY_OUTBOX_RELAY_KICK="false", CELERY_TASK_ALWAYS_EAGER="true",  # the send runs after the commit, here
        TALLY_PAYOUT_LEASE_SECONDS="2", TALLY_PSP_TIMEOUT_SECONDS="2", **live_redis_env(),
    )
    env.update({"TALLY_LOG_LEVEL": "WARNING", **extra})
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


@dataclass
class Web:
    port: int
    extra: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0

    def start(self) -> None:
        env = _env(PORT=str(self.port), WEB_CONCURRENCY="2", **self.extra)
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "config.wsgi:application", "-c", str(ROOT / "config/gunicorn.py")],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                assert self.process.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)  # the master and its workers, mid-request
        self.process.wait(timeout=10)
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)


@dataclass
class Key:
    merchant: str
    api_key: str
    amount: int
    idem: str = field(default_factory=lambda: uuid.uuid4().hex)
    answers: list[int] = field(default_factory=list)
    payout: str = ""


def _post(port: int, key: Key) -> int:
    """One attempt: the status, or 0 when the connection died (a kill)."""
    body = json.dumps({"asset": "JPY", "amount": key.amount}).encode()
    head = (
        f"POST /v1/merchant/payouts HTTP/1.1\r\nHost: {PAYOUTS_TENANT['domain']}\r\nAuthorization: Bearer {key.api_key}\r\n"
        f"Idempotency-Key: {key.idem}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
    except OSError:
        return 0
    if not raw.startswith(b"HTTP/1.1 "):
        return 0
    status = int(raw[9:12])
    if status == 201:
        key.payout = json.loads(raw.split(b"\r\n\r\n", 1)[1])["id"]
    return status


def _clients(port: int, keys: list[Key], *, threads: int, deadline: float) -> list[threading.Thread]:
    """Threads that send each key until a final answer (a 409 or 503, or no answer, is sent again)."""
    lock = threading.Lock()
    todo = list(keys)

    def run() -> None:
        while True:
            with lock:
                if not todo:
                    return
                key = todo.pop(0)
            while time.monotonic() < deadline:
                status = _post(port, key)
                key.answers.append(status)
                if status in FINAL or status == 500:
                    break
                time.sleep(0.2)

    started = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for thread in started:
        thread.start()
    return started


def _scheduled_run_killed(merchants: list[Merchant]) -> int:
    """The scheduled payouts in a process of their own, killed once it has made a payout;
    how many it had made by then."""
    code = (
        "import django; django.setup(); from django.db import connection; "
        f"connection.set_schema({PAYOUTS_TENANT['schema_name']!r}); "
        "from payments.services.payouts import payouts_scheduled_run; payouts_scheduled_run(concurrency=4)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env(TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS="0.3"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheduled = Payout.objects.filter(merchant__in=merchants, origin="scheduled")
    deadline = time.monotonic() + 60
    while not scheduled.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the scheduled run made no payout"
        time.sleep(0.05)
    time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    return scheduled.count()


def _converge(world: World, merchants: list[Merchant], *, seconds: float = 60.0) -> None:
    """Beat's recovery, run until no payout of these merchants is pending or in transit."""
    deadline = time.monotonic() + seconds
    while True:
        connection.set_schema(PAYOUTS_TENANT["schema_name"])
        open_ = Payout.objects.filter(merchant__in=merchants, status__in=["pending", "in_transit"])
        if not open_.exists():
            return
        assert time.monotonic() < deadline, list(open_.values_list("pk", "status", "attempts", "last_error"))
        world.sim.settle_payouts()
        payout_recovery_run()
        time.sleep(0.5)


def test_payouts_survive_sigkill_of_the_web_and_of_the_scheduled_run(payouts_world: World, settings: Any) -> None:
    world = payouts_world
    settings.TALLY_PAYOUT_CHECK_SECONDS = 1
    world.sim.faults(payouts_manual=False, payout_settle_ms=300, payout_arrival_seconds=1)
    tokens = ["btok_bank"] * 6 + ["btok_bank_returned", "btok_bank_declined"]
    merchants = [world.merchant(funds=1_000, token=token) for token in tokens]
    port = free_port()
    world.sim.webhook_endpoint(world.psp_key, f"http://{PAYOUTS_TENANT['domain']}:{port}/v1/psp/webhooks/simulator", "whsec_payouts_1")

    # 1. Killed between the PSP's answer and the completion.
    web = Web(port=port, extra={"TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS": "30"})
    web.start()
    first = Key(merchant=merchants[0].pk, api_key=api_key_create(principal=merchants[0])[1], amount=300)
    client = threading.Thread(target=lambda: first.answers.append(_post(port, first)), daemon=True)
    client.start()
    deadline = time.monotonic() + 30
    while not world.sim.payouts(world.psp_key):
        assert time.monotonic() < deadline, ("the PSP was never asked", first.answers)
        time.sleep(0.05)
    web.kill()
    client.join(timeout=10)
    assert Payout.objects.get(merchant=merchants[0]).status == "pending"  # made at the PSP, not completed here

    # 2. Killed at random moments under load, clients sending each key until a final answer.
    web.extra = {"TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS": "0.2"}
    web.start()
    keys = [first] + [
        Key(merchant=m.pk, api_key=api_key_create(principal=m)[1], amount=amount)
        for m in merchants for amount in (200, 250) if not (m == merchants[0] and amount == 250)
    ]
    threads = _clients(port, [*keys[1:], first], threads=4, deadline=time.monotonic() + 90)
    for pause in (1.0, 1.7):
        time.sleep(pause)
        web.kill()
        time.sleep(0.3)
        web.start()
    for thread in threads:
        thread.join(timeout=120)
    web.stop()

    # 3. The scheduled run, killed mid-way (the merchants' whole available balances).
    Merchant.objects.filter(pk__in=[m.pk for m in merchants]).update(payout_schedule="daily")
    made_before_the_kill = _scheduled_run_killed(merchants)
    _converge(world, merchants)

    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    payouts = list(Payout.objects.filter(merchant__in=merchants))
    statuses = Counter(p.status for p in payouts)
    assert set(statuses) <= {"paid", "failed", "canceled"}, statuses
    assert all(key.answers and key.answers[-1] in FINAL for key in keys), [(k.idem, k.answers) for k in keys]
    assert not any(500 in key.answers for key in keys)
    at_psp = {p["metadata"]["tally_payout"]: p for p in world.sim.payouts(world.psp_key)}
    assert len(at_psp) == len(world.sim.payouts(world.psp_key))  # one PSP payout per payout of ours
    for payout in payouts:
        kinds = ledger_kinds(payout)
        psp = at_psp.get(payout.pk)
        if payout.status == "paid":
            assert kinds == ["payout", "payout_paid"] and psp is not None and psp["status"] == "paid", (payout.pk, kinds, psp)
        else:
            assert kinds == ["payout", "payout_back"], (payout.pk, kinds)
            assert psp is None or psp["status"] == "failed", (payout.pk, psp)
    for merchant in merchants:
        paid = sum(p.amount for p in payouts if p.merchant_id == merchant.pk and p.status == "paid")
        assert balance(merchant) == 1_000 - paid, merchant.pk
    # Other payout tests share the tenant (and its in-transit account) and may be running: in one snapshot, the
    # account holds what unfinished payouts hold, and none of these merchants' payouts is unfinished (above).
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert system_balance(SystemRole.PAYOUTS_IN_TRANSIT) == payouts_in_transit_totals().get("JPY", 0)
    assert statuses["paid"] > 0 and statuses["failed"] > 0
    figures("payouts_sigkill", payouts=len(payouts), paid=statuses["paid"], failed=statuses["failed"], web_kills=web.kills,
            scheduled_run_kills=1, scheduled_made_before_kill=made_before_the_kill, keys=len(keys),
            retried=sum(1 for k in keys if len(k.answers) > 1), lost=0, doubled=0)
