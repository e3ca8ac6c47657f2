"""Staged migrations under live traffic, and a backfill killed with SIGKILL.

Each migration runs end to end (expand, backfill, verify, switch-reads, contract) on two
scratch tenants while threads keep paying (and refunding) and updating contacts on both.
At the end verify reports zero differences, no payment or contact update failed, no
deadlock was even retried, and the ledger is intact. Then a real `manage.py
staged_migration ... backfill` process is killed with SIGKILL halfway and resumed: it
converges, with every row once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, Value
from django.db.models.functions import Concat

from payments.models import Payment
from payments.services.charges import payment_create
from payments.services.refunds import refund_create
from tenants.models import Tenant
from tests.conftest import run_in_thread_tenant
from tests.factories import CustomerFactory, MerchantFactory, StoreFactory, TerminalFactory, fund
from tests.staged_support import db_env, scratch_tenants, staged
from tests.test_ledger_concurrency import _deadlocks_retried
from wallets.contacts import UNSET, Unset, customer_contact
from wallets.models import AccountDailyTotal, Customer, CustomerLegacyContact, StagedMigrationState, StagedPhase
from wallets.selectors import balance_entry_mismatches, ledger_orphan_references, ledger_unbalanced_transactions
from wallets.services.contacts import customer_contact_update
from wallets.services.principals import customer_create
from wallets.staged.phases import staged_phase_forget

ROOT = Path(__file__).resolve().parent.parent
CONTACTS, TOTALS = "customer_contacts", "merchant_daily_totals"


class Traffic:
    """Payments, refunds and contact updates on one tenant, on their own threads."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        with_tenant = connection.schema_name
        connection.set_tenant(tenant)
        self.customers = [customer_create(name=f"T{n}", email=f"t{n}@example.com", phone=f"+1 555 01{n:02d}") for n in range(30)]
        for customer in self.customers:
            fund(customer, 10_000_000)
        self.terminals = [TerminalFactory(store=StoreFactory(merchant=MerchantFactory())) for _ in range(3)]
        # History from before the migration (the backfill has something to copy).
        for n in range(40):
            payment_create(terminal=self.terminals[n % 3], customer=self.customers[n % 30], asset_code="JPY", amount=10 + n)
        self.expected = {c.pk: (f"t{n}@example.com", f"+1 555 01{n:02d}") for n, c in enumerate(self.customers)}
        self.errors: list[str] = []
        self.payments = self.refunds = self.contact_updates = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(self._pay, seed)) for seed in range(2)]
        self.threads.append(threading.Thread(target=self._run, args=(self._contacts, 99)))
        if with_tenant == "public":
            connection.set_schema_to_public()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in self.threads)

    def _run(self, body: Any, seed: int) -> None:
        run_in_thread_tenant(self.tenant, lambda: body(random.Random(seed)))

    def _pay(self, rng: random.Random) -> None:
        while not self.stop.is_set():
            try:
                terminal, customer = rng.choice(self.terminals), rng.choice(self.customers)
                payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=rng.randint(1, 500))
                self.payments += 1
                if rng.random() < 0.2:
                    refund_create(payment=payment, amount=1)
                    self.refunds += 1
            except Exception as exc:  # any failure is the migration's fault here
                self.errors.append(f"payment: {exc!r}")

    def _contacts(self, rng: random.Random) -> None:
        while not self.stop.is_set():
            customer = rng.choice(self.customers)
            email: str | Unset | None = rng.choice([UNSET, None, f"u{rng.randint(0, 10**6)}@example.com"])
            phone: str | Unset | None = rng.choice([UNSET, None, f"+44 20 {rng.randint(1000, 9999)} 0000"])
            try:
                customer_contact_update(customer_id=customer.pk, email=email, phone=phone)
            except Exception as exc:
                self.errors.append(f"contact: {exc!r}")
                continue
            old_email, old_phone = self.expected[customer.pk]
            self.expected[customer.pk] = (
                old_email if isinstance(email, Unset) else (email or ""), old_phone if isinstance(phone, Unset) else (phone or "")
            )
            self.contact_updates += 1
            time.sleep(0.002)


@pytest.mark.parametrize("name", [CONTACTS, TOTALS])
def test_each_migration_end_to_end_on_two_tenants_under_live_traffic(
    django_db_setup: None, django_db_blocker: Any, settings: Any, name: str
) -> None:
    # No eager relay kicks from the threads: tenant-schemas-celery keeps the schema to
    # restore after an eager task on the (shared) task object, so two threads of different
    # tenants running it at once can come back in each other's schema.
    settings.TALLY_OUTBOX_RELAY_KICK = False
    with django_db_blocker.unblock(), scratch_tenants(2) as tenants:
        traffic = [Traffic(tenant) for tenant in tenants]
        deadlocks = _deadlocks_retried()
        for t in traffic:
            t.start()
        try:
            time.sleep(0.5)
            for phase in ("expand", "backfill", "verify", "switch-reads", "contract"):
                paid = sum(t.payments for t in traffic)
                for tenant in tenants:
                    # A throttled backfill in small batches, so that it runs among the payments.
                    options = {"batch": 5, "rate": 100.0} if phase == "backfill" else {}
                    run = staged(name, phase, tenant=tenant, **options)
                    assert run.code == 0, (phase, tenant.schema_name, run)
                    if phase == "verify":
                        assert "verify passed" in run.out
                deadline = time.monotonic() + 15  # payments keep flowing (a loaded machine may be slow)
                while sum(t.payments for t in traffic) <= paid and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert sum(t.payments for t in traffic) > paid, f"no payment went through during or after {phase}"
        finally:
            for t in traffic:
                t.finish()
        assert [e for t in traffic for e in t.errors] == []
        assert _deadlocks_retried() == deadlocks, "a deadlock was retried"
        assert all(t.payments > 20 and t.contact_updates > 10 for t in traffic), [(t.payments, t.contact_updates) for t in traffic]
        for t in traffic:
            connection.set_tenant(t.tenant)
            staged_phase_forget()
            state = StagedMigrationState.objects.get(name=name)
            assert state.phase == StagedPhase.CONTRACTED and state.verify_ok is True
            assert state.verify_report["difference_count"] == 0
            assert balance_entry_mismatches() == [] and ledger_unbalanced_transactions() == [] and ledger_orphan_references() == []
            if name == TOTALS:  # the ledger stays, so verify still compares after contract, traffic done
                run = staged(name, "verify", tenant=t.tenant)
                assert run.code == 0 and "verify passed" in run.out, run
                connection.set_tenant(t.tenant)
                assert Payment.objects.count() == 40 + t.payments
            else:  # the plaintext is gone; what the customers read is what the threads last wrote
                for customer in Customer.objects.filter(pk__in=list(t.expected)):
                    contact = customer_contact(customer=customer)
                    assert (contact.email, contact.phone) == t.expected[customer.pk], customer.pk


def _customers_bulk(count: int) -> None:
    Customer.objects.bulk_create([Customer(name=f"Bulk {n}") for n in range(count)], batch_size=1000)
    CustomerLegacyContact.objects.update(email=Concat(Value("b-"), "id", Value("@example.com")), phone=Value("+1 555 0100"))


def _merchants_with_history(count: int) -> None:
    customer, staff_terminal = CustomerFactory(), None
    fund(customer, 10_000_000)
    for n in range(count):
        terminal = TerminalFactory(store=StoreFactory(merchant=MerchantFactory()))
        staff_terminal = terminal
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100 + n)
    assert staff_terminal is not None


def _backfill_process(name: str, schema: str, *, batch: int, rate: float) -> subprocess.Popen[str]:
    command = [sys.executable, "manage.py", "staged_migration", name, "backfill", "--tenant", schema]
    return subprocess.Popen(
        [*command, "--batch", str(batch), "--rate", str(rate), "--no-progress"],
        cwd=ROOT, env=db_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.proof
@pytest.mark.parametrize("name", [CONTACTS, TOTALS])
def test_a_backfill_killed_with_sigkill_halfway_resumes_and_converges_with_no_duplicates(
    django_db_setup: None, django_db_blocker: Any, name: str
) -> None:
    with django_db_blocker.unblock(), scratch_tenants(1) as (tenant,):
        connection.set_tenant(tenant)
        if name == CONTACTS:
            _customers_bulk(600)
            total, batch, rate, kill_after = 600, 20, 150.0, 200
        else:
            _merchants_with_history(40)
            total, batch, rate, kill_after = 40, 2, 10.0, 12
        assert staged(name, "expand", tenant=tenant).code == 0
        connection.set_tenant(tenant)
        process = _backfill_process(name, tenant.schema_name, batch=batch, rate=rate)
        try:
            deadline = time.monotonic() + 60
            while StagedMigrationState.objects.get(name=name).rows_done < kill_after:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the backfill never got halfway"
                time.sleep(0.05)
        finally:
            os.kill(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        assert process.returncode == -signal.SIGKILL, (out, err)
        state = StagedMigrationState.objects.get(name=name)
        assert state.phase == StagedPhase.EXPANDED and state.cursor and kill_after <= state.rows_done < total, (state.rows_done, state.cursor)
        if name == CONTACTS:
            # The new path writes a customer the backfill has not reached: the resume must keep it.
            staged_phase_forget()
            late = Customer.objects.filter(pk__gt=state.cursor, email_ciphertext__isnull=True).order_by("pk").last()
            assert late is not None
            customer_contact_update(customer_id=late.pk, email="kept@example.com")
        # Resume (PostgreSQL frees the killed session's advisory lock once it notices).
        deadline = time.monotonic() + 30
        while True:
            resumed = _backfill_process(name, tenant.schema_name, batch=batch, rate=0.0)
            out, err = resumed.communicate(timeout=120)
            if resumed.returncode == 0:
                break
            assert "another run holds" in err and time.monotonic() < deadline, (out, err)
            time.sleep(0.2)
        assert "backfilled" in out, out
        state = StagedMigrationState.objects.get(name=name)
        assert (state.phase, state.rows_done, state.rows_total) == (StagedPhase.BACKFILLED, total, total)
        run = staged(name, "verify", tenant=tenant)
        assert run.code == 0 and "verify passed" in run.out, run
        connection.set_tenant(tenant)
        if name == CONTACTS:
            staged_phase_forget()
            assert customer_contact(customer=Customer.objects.get(pk=late.pk)).email == "kept@example.com"
            assert not Customer.objects.filter(email_ciphertext__isnull=True).exists()
        else:
            keys = AccountDailyTotal.objects.values("account_id", "asset_id", "day").annotate(n=Count("id"))
            assert len(keys) == 40 and all(k["n"] == 1 for k in keys)  # one row per merchant day: nothing twice
