"""`make run`'s demo tenant has a history: weeks of payments across shops and days, refunds,
transfers and top-ups, written through the services under a dev clock. Last month is
complete (its month-end report balances and is not empty), the trial balance sums to zero,
reconciliation ran once at seed with no critical finding, and a second seed adds nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models.functions import TruncDate
from django.utils import timezone
from django_tenants.utils import schema_context

from devtools.demo_seed import DEMO_SCHEMA, demo_history_start, demo_seed
from payments.models import Payment, Refund, Transfer
from reconciliation.books import month_end_report, trial_balance_summary
from reconciliation.models import ReconciliationRun
from tenants.models import Tenant
from tenants.selectors import tenant_zone
from wallets.books import account_balance_before
from wallets.models import Account, AccountKind, LedgerEntry, LedgerTransaction


def test_the_demo_seed_writes_a_history_once_and_reconciliation_is_clean(django_db_setup: None, django_db_blocker: Any, tmp_path: Path) -> None:
    with django_db_blocker.unblock():
        demo_seed(keys_file=tmp_path / "keys.json")
        with schema_context(DEMO_SCHEMA):
            zone = tenant_zone()
            today = timezone.now().astimezone(zone).date()
            first = demo_history_start(today=today)
            history = Payment.objects.filter(created__lt=timezone.now() - timedelta(days=1))
            days = set(history.annotate(day=TruncDate("created", tzinfo=zone)).values_list("day", flat=True))
            assert len(days) >= 25 and min(days) == first
            assert history.values("merchant_id").distinct().count() >= 3
            assert Refund.objects.filter(created__lt=timezone.now() - timedelta(days=1)).exists()
            assert Transfer.objects.filter(created__lt=timezone.now() - timedelta(days=1)).exists()
            assert history.filter(fee__gt=0).count() == history.count()  # the fee was in force from the first day
            # Stamps agree: each payment's ledger transaction was written at its moment.
            for payment in history.order_by("?")[:20]:
                txn = LedgerTransaction.objects.get(pk=payment.ledger_transaction_id)
                assert abs((txn.created - payment.created).total_seconds()) < 1

            last_month = month_end_report(asset_code="JPY", month=first)
            assert last_month.inflows and last_month.outflows and last_month.closing > last_month.opening
            assert last_month.opening + last_month.inflow_total - last_month.outflow_total == last_month.closing
            assert Tenant.objects.get(schema_name=DEMO_SCHEMA).created <= last_month.start
            # Nobody's balance went below zero at any moment of the history: checked at each day's end.
            participants = list(Account.objects.exclude(kind=AccountKind.SYSTEM).values_list("id", flat=True))
            for day in sorted(days)[::5]:
                end = last_month.start + timedelta(days=(day - first).days + 1)
                assert all(account_balance_before(account_id=a, asset_code="JPY", instant=end) >= 0 for a in participants), day
            assert all(t.balanced for t in trial_balance_summary(at=timezone.now()))

            # The seed's run (in a shared test database an earlier test may have reconciled the demo tenant too).
            runs = list(ReconciliationRun.objects.filter(requested_by="demo seed"))
            assert len(runs) == 1 and runs[0].status in ("clean", "findings")
            # Warnings it may document: history events not yet published (the worker relays them
            # once `make run` starts), the PSP not reachable at seed.
            assert set(runs[0].report.get("by_kind", {})) <= {"outbox_lag", "psp_settlement_unavailable", "payout_settlement_unavailable"}
            critical = runs[0].findings.filter(severity="critical")
            assert not critical.exists(), list(critical.values_list("kind", "summary"))
            entries = LedgerEntry.objects.count()

        demo_seed(keys_file=tmp_path / "keys.json")  # a reused database: nothing added
        with schema_context(DEMO_SCHEMA):
            assert LedgerEntry.objects.count() == entries
            assert ReconciliationRun.objects.filter(requested_by="demo seed").count() == 1
        connection.set_schema_to_public()
