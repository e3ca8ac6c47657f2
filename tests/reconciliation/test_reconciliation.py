"""Reconciliation: each kind of discrepancy is found when planted, nothing on
clean data; `manage.py reconcile` exits 1 with findings and 0 when clean; the schedule
lives in django-celery-beat and survives an admin's edit. Fixtures: conftest.py here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from idempotency.models import IdempotencyRecord, RecordState
from payments.models import OutboxEvent, Payment
from payments.services.charges import payment_create
from payments.services.refunds import refund_create
from reconciliation.models import ReconciliationRun, RunStatus, RunTrigger
from reconciliation.registry import CHECKS
from reconciliation.services import reconciliation_run_execute, reconciliation_run_request
from tenants.models import Tenant
from tests.factories import TerminalFactory
from tests.reconciliation.conftest import kinds, reconcile
from wallets.models import Balance, LedgerEntry
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpoint


def test_clean_data_has_no_findings(world: dict[str, Any]) -> None:
    run = reconcile()
    assert run.status == RunStatus.CLEAN, run.report
    assert run.findings_count == 0 and not run.findings.exists()
    assert set(run.report["checks"]) == {c.name for c in CHECKS}
    assert run.report["checks"]["ledger_balances"]["stats"]["entries"] > 10
    assert run.metrics["idempotency_stuck"] == 0 and "outbox_lag_seconds" in run.metrics
    assert run.duration_ms is not None and run.finished_at is not None


def test_balance_edited_behind_the_ledgers_back(world: dict[str, Any]) -> None:
    account_id = world["alice"].account.pk
    with connection.cursor() as cursor:  # no trigger guards balances against UPDATE: only the ledger is append-only
        cursor.execute("UPDATE wallets_balance SET balance = balance + 7 WHERE account_id = %s AND asset_id = 'JPY'", [account_id])
    run = reconcile()
    assert run.status == RunStatus.FINDINGS
    finding = run.findings.get(kind="ledger_balance_mismatch")
    assert finding.details["account"] == account_id and finding.details["difference"] == 7 and finding.severity == "critical"
    assert finding.details["owner"] == f"customer:{world['alice'].pk}"
    assert finding.refs == [{"app_label": "wallets", "model": "account", "pk": account_id},
                            {"app_label": "wallets", "model": "customer", "pk": world["alice"].pk}]
    # The edit also broke conservation: the JPY balances no longer sum to zero.
    assert run.findings.get(kind="asset_not_conserved").details == {"asset": "JPY", "sum_of_balances": 7}


def test_a_merchant_shard_edited(world: dict[str, Any]) -> None:
    """Merchant balances are 32 shard rows: moving money between two shards changes no sum
    (not a finding); changing one shard is."""
    merchant_account = world["terminal"].store.merchant.account.pk
    rows = Balance.objects.filter(account_id=merchant_account, asset_id="JPY")
    assert rows.count() == 32
    rich = rows.filter(balance__gte=50).order_by("shard").first()
    poor = rows.exclude(pk=rich.pk).order_by("shard").first()
    Balance.objects.filter(pk=rich.pk).update(balance=rich.balance - 50)
    Balance.objects.filter(pk=poor.pk).update(balance=poor.balance + 50)
    assert reconcile().findings_count == 0
    Balance.objects.filter(pk=poor.pk).update(balance=poor.balance + 49)
    run = reconcile()
    finding = run.findings.get(kind="ledger_balance_mismatch")
    assert finding.details["account"] == merchant_account and finding.details["shards"] == 32


def test_held_edited_without_a_hold(world: dict[str, Any]) -> None:
    Balance.objects.filter(account_id=world["bob"].account.pk, asset_id="JPY").update(held=10)
    run = reconcile()
    assert kinds(run) == {"ledger_held_mismatch": 1}
    assert run.findings.get().details["difference"] == 10


def test_conservation_broken_by_a_lone_entry(world: dict[str, Any]) -> None:
    """The append-only triggers refuse UPDATE and DELETE on the ledger, not INSERT: a
    one-legged entry can be planted, and is found (and its balance and daily totals no longer match)."""
    txn_id = world["payment"].ledger_transaction_id
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created) VALUES (%s, %s, 'JPY', 5, now())",
            [txn_id, world["bob"].account.pk],
        )
    run = reconcile()
    finding = run.findings.get(kind="ledger_unbalanced_transaction")
    assert finding.details == {"transaction": txn_id, "asset": "JPY", "sum": 5, "entries": 3}
    assert finding.refs == [{"app_label": "wallets", "model": "ledgertransaction", "pk": txn_id}]
    # The tenant was born with daily totals (a new tenant's start contracted): the planted
    # entry is not in them either.
    assert kinds(run) == {"ledger_unbalanced_transaction": 1, "ledger_balance_mismatch": 1, "daily_total_mismatch": 1}


def test_the_ledger_refuses_edits(world: dict[str, Any]) -> None:
    """Why the plants above go through balances and inserts: editing an entry is refused."""
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        LedgerEntry.objects.filter(transaction_id=world["payment"].ledger_transaction_id).update(amount=1)


def test_duplicate_charge_suspect(world: dict[str, Any]) -> None:
    alice, terminal = world["alice"], world["terminal"]
    first = world["payment"]
    second = payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=1200)
    run = reconcile()
    assert kinds(run) == {"duplicate_charge_suspect": 1}
    finding = run.findings.get()
    assert finding.details["payment"] == second.pk and finding.details["previous_payment"] == first.pk
    assert finding.details["customer"] == alice.pk and finding.details["amount"] == 1200
    assert {"app_label": "payments", "model": "payment", "pk": second.pk} in finding.refs
    # Refunded in full, the duplicate is undone: no longer a suspect.
    refund_create(payment=second, amount=1200, reason="duplicate")
    assert reconcile().findings_count == 0
    Payment.objects.filter(pk=second.pk).update(amount_refunded=600)  # (partly refunded: a suspect again)
    assert kinds(reconcile()) == {"duplicate_charge_suspect": 1}
    # Six minutes apart is not a suspect.
    Payment.objects.filter(pk=second.pk).update(created=first.created + timedelta(minutes=6))
    assert reconcile().findings_count == 0
    # Inside the window, to another merchant: not a suspect either.
    other = payment_create(terminal=TerminalFactory(), customer=alice, asset_code="JPY", amount=1200)
    Payment.objects.filter(pk=other.pk).update(created=first.created + timedelta(seconds=30))
    assert reconcile().findings_count == 0


def _record(key: str, lease_expires_at: Any) -> IdempotencyRecord:
    now = timezone.now()
    return IdempotencyRecord.objects.create(
        principal_id="ter_x", key=key, scope="terminal", fingerprint="f" * 64, state=RecordState.IN_FLIGHT,
        lease_expires_at=lease_expires_at, request_id="req_1", method="POST", path="/v1/terminal/payments", created=now, updated=now,
    )


def test_stuck_in_flight_key(world: dict[str, Any]) -> None:
    _record("live", timezone.now() + timedelta(seconds=60))  # in flight, lease running: not stuck
    stuck = _record("crashed", timezone.now() - timedelta(minutes=10))
    run = reconcile()
    assert kinds(run) == {"idempotency_stuck_in_flight": 1}
    finding = run.findings.get()
    assert finding.details["key"] == "crashed" and finding.details["stuck_seconds"] >= 600
    assert finding.refs == [{"app_label": "idempotency", "model": "idempotencyrecord", "pk": str(stuck.pk)}]
    assert run.metrics["idempotency_stuck"] == 1 and run.metrics["idempotency_in_flight"] == 2


def test_outbox_dead_letter_and_lag(world: dict[str, Any]) -> None:
    OutboxEvent.objects.filter(published_at__isnull=True).update(published_at=timezone.now())  # the relay caught up
    dead = OutboxEvent.objects.create(topic="payment.succeeded", payload={}, attempts=8, last_error="broker down", dead_at=timezone.now())
    late = OutboxEvent.objects.create(topic="refund.succeeded", payload={}, created=timezone.now() - timedelta(minutes=30))
    run = reconcile()
    assert kinds(run) == {"outbox_dead_letter": 1, "outbox_lag": 1}
    assert run.findings.get(kind="outbox_dead_letter").details["event"] == dead.pk
    lag = run.findings.get(kind="outbox_lag")
    assert lag.details["oldest_event"] == late.pk and lag.details["lag_seconds"] >= 1800
    assert run.metrics["outbox_dead_letters"] == 1 and run.metrics["outbox_lag_seconds"] >= 1800


def test_webhook_dead_letter(world: dict[str, Any]) -> None:
    OutboxEvent.objects.filter(published_at__isnull=True).update(published_at=timezone.now())
    merchant = world["terminal"].store.merchant
    endpoint = WebhookEndpoint.objects.create(merchant=merchant, url="https://hooks.example/x", enabled_events=["*"])
    event = OutboxEvent.objects.create(topic="payment.succeeded", payload={}, published_at=timezone.now())
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event=event, topic=event.topic, event_created=event.created, status=WebhookDeliveryStatus.FAILED,
        attempts=12, give_up_at=timezone.now(), last_status_code=500,
    )
    run = reconcile()
    assert kinds(run) == {"webhook_dead_letter": 1}
    finding = run.findings.get()
    assert finding.details["delivery"] == delivery.pk and finding.details["last_status_code"] == 500
    assert {"app_label": "webhooks", "model": "webhookdelivery", "pk": delivery.pk} in finding.refs



def test_an_expired_webhook_delivery_is_a_finding_too(world: dict[str, Any]) -> None:
    """A delivery whose window closed while its endpoint was disabled never reached the
    merchant either: it is shown as its own kind."""
    OutboxEvent.objects.filter(published_at__isnull=True).update(published_at=timezone.now())
    merchant = world["terminal"].store.merchant
    endpoint = WebhookEndpoint.objects.create(merchant=merchant, url="https://hooks.example/x", enabled_events=["*"])
    event = OutboxEvent.objects.create(topic="payment.succeeded", payload={}, published_at=timezone.now())
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event=event, topic=event.topic, event_created=event.created, status=WebhookDeliveryStatus.EXPIRED,
        attempts=0, give_up_at=timezone.now(), last_error="expired: the endpoint was disabled",
    )
    run = reconcile()
    assert kinds(run) == {"webhook_expired": 1}
    assert run.findings.get().details["delivery"] == delivery.pk and "expired" in run.findings.get().summary
    assert run.metrics["webhook_expired"] == 1

def test_orphaned_reference(world: dict[str, Any]) -> None:
    """Payments carry no database foreign keys (hot table): a payment naming a customer
    that does not exist is an orphan `ledger_orphan_references` reports."""
    pay = world["payment"]
    Payment.objects.create(
        customer_id="cus_ghost", merchant_id=pay.merchant_id, asset_id="JPY", amount=1, ledger_transaction_id=pay.ledger_transaction_id,
    )
    run = reconcile()
    assert kinds(run) == {"orphan_reference": 1}
    details = run.findings.get().details
    assert details == {"table": "payments_payment", "column": "customer_id", "value": "cus_ghost", "target": "wallets.customer", "rows": 1}


def test_findings_past_the_cap_are_counted_not_stored(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciliation import services

    monkeypatch.setattr(services, "MAX_FINDINGS_STORED_PER_CHECK", 2)
    for key in ("a", "b", "c", "d", "e"):
        _record(key, timezone.now() - timedelta(minutes=5))
    run = reconcile()
    assert run.findings_count == 5 and run.findings.count() == 2
    assert run.report["checks"]["idempotency_stuck"] == {**run.report["checks"]["idempotency_stuck"], "findings": 5, "stored": 2}


def test_command_exits_non_zero_on_findings_and_zero_when_clean(world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    call_command("reconcile", tenant="test_recon")
    out, err = capsys.readouterr()
    assert "test_recon: run" in out and "clean" in out
    assert f"[##############################] {len(CHECKS)}/{len(CHECKS)}" in err  # the progress bar, complete
    _record("crashed", timezone.now() - timedelta(minutes=10))
    with pytest.raises(CommandError) as raised:
        call_command("reconcile", tenant="test_recon")
    assert raised.value.returncode == 1
    out, _ = capsys.readouterr()
    assert "idempotency_stuck_in_flight: 1" in out and "'crashed'" in out
    with pytest.raises(CommandError) as raised:
        call_command("reconcile", tenant="no_such_tenant")
    assert raised.value.returncode == 2
    assert ReconciliationRun.objects.filter(trigger=RunTrigger.COMMAND).count() == 2


def test_command_exit_status_in_a_real_process(recon_tenant_committed: Tenant, django_db_blocker: Any) -> None:
    """The exit status an operator's script sees, from `manage.py reconcile` in its own
    process against this test database: 1 with a (committed) finding, 0 once it is gone,
    2 for an unknown tenant."""
    import os
    import subprocess
    import sys

    from django.db import connections

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "TALLY_TEST_DB_NAME": connections["default"].settings_dict["NAME"]}

    def reconcile_in_a_process(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", "reconcile", *args], capture_output=True, text=True, timeout=120, env=env)

    with django_db_blocker.unblock():
        connection.set_tenant(recon_tenant_committed)
        stuck = _record("committed-crash", timezone.now() - timedelta(minutes=10))
        try:
            done = reconcile_in_a_process("--tenant", "test_recon")
            assert done.returncode == 1, done.stdout + done.stderr
            assert "idempotency_stuck_in_flight: 1" in done.stdout
        finally:
            IdempotencyRecord.objects.filter(pk=stuck.pk).delete()
        done = reconcile_in_a_process("--tenant", "test_recon")
        assert done.returncode == 0, done.stdout + done.stderr
        ReconciliationRun.objects.all().delete()
        connection.set_schema_to_public()
    done = reconcile_in_a_process("--tenant", "no_such_tenant")
    assert done.returncode == 2 and "no active tenant" in done.stderr


def test_beat_fans_out_one_run_per_tenant(recon_tenant: Tenant, django_capture_on_commit_callbacks: Any) -> None:
    from reconciliation.tasks import reconciliation_run_all_tenants

    with django_capture_on_commit_callbacks(execute=True):
        fanned = reconciliation_run_all_tenants.apply().get()
    assert fanned >= 3  # tenants A, B and this one
    connection.set_tenant(recon_tenant)
    run = ReconciliationRun.objects.get(trigger=RunTrigger.BEAT)
    assert run.status in (RunStatus.CLEAN, RunStatus.FINDINGS) and run.finished_at is not None


def test_schedule_is_a_beat_periodic_task_an_admin_edit_survives(db: None) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from reconciliation.services import SCHEDULE_NAME, SCHEDULE_TASK, reconciliation_schedule_ensure

    connection.set_schema_to_public()
    assert PeriodicTask.objects.filter(name=SCHEDULE_NAME).exists()  # made after migrating the public schema (post_migrate)
    task = reconciliation_schedule_ensure()  # idempotent
    assert PeriodicTask.objects.filter(name=SCHEDULE_NAME).count() == 1
    assert task.task == SCHEDULE_TASK and task.interval.every == 1 and task.interval.period == IntervalSchedule.HOURS
    task.interval, _ = IntervalSchedule.objects.get_or_create(every=15, period=IntervalSchedule.MINUTES)
    task.save()
    assert reconciliation_schedule_ensure().interval.every == 15  # the staff's edit is kept


def test_a_run_executes_once_unless_its_process_died(world: dict[str, Any]) -> None:
    from reconciliation.services import RUN_TIME_LIMIT_SECONDS

    run = reconcile()
    finished = run.finished_at
    assert reconciliation_run_execute(run_id=run.pk).finished_at == finished  # a duplicate delivery: nothing again
    running = reconciliation_run_request(trigger=RunTrigger.BEAT)
    ReconciliationRun.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING, started_at=timezone.now())
    assert reconciliation_run_execute(run_id=running.pk).status == RunStatus.RUNNING  # another worker has it
    # Left "running" past the task's hard limit: its process died; run it again.
    ReconciliationRun.objects.filter(pk=running.pk).update(started_at=timezone.now() - timedelta(seconds=RUN_TIME_LIMIT_SECONDS + 1))
    assert reconciliation_run_execute(run_id=running.pk).status == RunStatus.CLEAN


@pytest.mark.proof
def test_a_run_killed_mid_way_commits_nothing_and_runs_again(recon_tenant_committed: Tenant, django_db_blocker: Any) -> None:
    """SIGKILL `manage.py reconcile` while it is inside its checks (held on a lock after it
    has found and inserted a finding): the run stays "running" with no finding committed;
    once past the time limit it is executed again, whole."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from django.db import connections, transaction

    from reconciliation.services import RUN_TIME_LIMIT_SECONDS

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "TALLY_TEST_DB_NAME": connections["default"].settings_dict["NAME"]}
    with django_db_blocker.unblock():
        connection.set_tenant(recon_tenant_committed)
        stuck = _record("killed-run", timezone.now() - timedelta(minutes=10))
        proc = None
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:  # the last check (webhook deliveries) waits here
                    cursor.execute("LOCK TABLE webhooks_webhookdelivery IN ACCESS EXCLUSIVE MODE")
                proc = subprocess.Popen([sys.executable, "manage.py", "reconcile", "--tenant", "test_recon"], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                backend = None
                deadline = time.monotonic() + 60
                while backend is None and time.monotonic() < deadline:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_stat_clear_snapshot()")  # activity is otherwise read once per transaction
                        cursor.execute(
                            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s AND datname = current_database()",
                            ["%webhooks_webhookdelivery%"],
                        )
                        row = cursor.fetchone()
                    backend = row[0] if row else None
                    time.sleep(0.1)
                if backend is None:
                    proc.kill()
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pid, state, wait_event_type, left(query, 200) FROM pg_stat_activity")
                        activity = cursor.fetchall()
                    raise AssertionError(f"the run never reached the locked table: {proc.communicate()[0][-3000:]} {activity}")
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
            run = ReconciliationRun.objects.get(trigger=RunTrigger.COMMAND)
            assert run.status == RunStatus.RUNNING and run.findings.count() == 0  # the finding it inserted died with it
            ReconciliationRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(seconds=RUN_TIME_LIMIT_SECONDS + 1))
            again = reconciliation_run_execute(run_id=run.pk)
            assert again.status == RunStatus.FINDINGS and kinds(again) == {"idempotency_stuck_in_flight": 1}
            assert again.findings.count() == 1
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
            IdempotencyRecord.objects.filter(pk=stuck.pk).delete()
            ReconciliationRun.objects.all().delete()
            connection.set_schema_to_public()
