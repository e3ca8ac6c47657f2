"""Staged data migrations (wallets.staged): the phase rules, the write semantics, the
read paths, on scratch tenants with committed data. The runs under load and the SIGKILL
resume are in test_staged_migrations_load.py."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django_tenants.utils import schema_context

from payments.services.charges import payment_create
from payments.services.refunds import refund_create
from tenants.models import Tenant
from tests.factories import CustomerFactory, TerminalFactory, fund
from tests.staged_support import scratch_tenants, staged
from wallets.contacts import (
    UNSET,
    Contact,
    contact_decrypt,
    customer_contact,
    customer_contact_masked,
    customers_find_by_email,
    email_lookup_hash,
    mask_email,
    mask_phone,
)
from wallets.daily_totals import merchant_daily_totals
from wallets.models import AccountDailyTotal, Customer, CustomerLegacyContact, StagedMigrationState, StagedPhase
from wallets.services.contacts import customer_contact_update
from wallets.services.principals import customer_create
from wallets.staged.phases import staged_phase_forget

CONTACTS, TOTALS = "customer_contacts", "merchant_daily_totals"


@pytest.fixture
def scratch(django_db_setup: None, django_db_blocker: Any) -> Iterator[Tenant]:
    with django_db_blocker.unblock(), scratch_tenants(1) as (tenant,):
        connection.set_tenant(tenant)
        yield tenant


def _phase(name: str) -> str:
    return str(StagedMigrationState.objects.get(name=name).phase)


def _plaintext_columns() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'wallets_customer' AND column_name IN ('email', 'phone')"
        )
        return {row[0] for row in cursor.fetchall()}


def _all_the_way(tenant: Tenant, name: str) -> None:
    for phase in ("expand", "backfill", "verify", "switch-reads", "contract"):
        run = staged(name, phase, tenant=tenant)
        assert run.code == 0, (phase, run)


# --- Safety rules ----------------------------------------------------------------------


@pytest.mark.parametrize("name", [CONTACTS, TOTALS])
def test_every_phase_run_twice_changes_nothing_the_second_time(scratch: Tenant, name: str) -> None:
    customer = customer_create(name="Ann", email="ann@example.com", phone="+81 90 1111 2222")
    terminal = TerminalFactory()
    fund(customer, 1000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    for phase in ("expand", "backfill", "verify", "switch-reads", "contract"):
        first = staged(name, phase, tenant=scratch)
        assert first.code == 0, (phase, first)
        state = StagedMigrationState.objects.get(name=name)
        second = staged(name, phase, tenant=scratch)
        assert second.code == 0, (phase, second)
        again = StagedMigrationState.objects.get(name=name)
        if phase == "verify":  # a check: it records its run, never moves the phase again
            assert again.phase == state.phase and again.history == state.history and again.verify_ok is True
        else:
            assert "no-op" in second.out, second
            assert (again.phase, again.history, again.phase_changed_at, again.cursor, again.rows_written) == (
                state.phase, state.history, state.phase_changed_at, state.cursor, state.rows_written,
            )
    assert _phase(name) == StagedPhase.CONTRACTED
    if name == CONTACTS:
        assert _plaintext_columns() == set()
        assert customer_contact(customer=Customer.objects.get(pk=customer.pk)).email == "ann@example.com"


@pytest.mark.parametrize("name", [CONTACTS, TOTALS])
def test_contract_before_verify_is_refused(scratch: Tenant, name: str) -> None:
    customer_create(name="Ann", email="ann@example.com")
    assert staged(name, "expand", tenant=scratch).code == 0
    refused = staged(name, "contract", tenant=scratch)
    assert refused.code == 1 and "verify has not passed on this tenant" in refused.err, refused
    assert staged(name, "backfill", tenant=scratch).code == 0
    refused = staged(name, "contract", tenant=scratch)
    assert refused.code == 1 and "verify has not passed on this tenant" in refused.err, refused
    assert _phase(name) == StagedPhase.BACKFILLED
    assert _plaintext_columns() == {"email", "phone"}
    # Verified but reads not switched: still refused, with its own reason.
    assert staged(name, "verify", tenant=scratch).code == 0
    refused = staged(name, "contract", tenant=scratch)
    assert refused.code == 1 and "switch reads first" in refused.err, refused


def test_a_failed_verify_exits_non_zero_and_blocks_contract(scratch: Tenant) -> None:
    customer = customer_create(name="Ann", email="ann@example.com")
    for phase in ("expand", "backfill", "verify", "switch-reads"):
        assert staged(CONTACTS, phase, tenant=scratch).code == 0
    # Someone writes the plaintext column behind the service layer's back.
    CustomerLegacyContact.objects.filter(pk=customer.pk).update(email="mallory@example.com")
    failed = staged(CONTACTS, "verify", tenant=scratch)
    assert failed.code == 1 and "verify FAILED: 2 differences" in failed.err, failed
    assert "email differs" in failed.err and "email hash differs" in failed.err
    assert "mallory" not in failed.err  # ids, never values
    state = StagedMigrationState.objects.get(name=CONTACTS)
    assert state.verify_ok is False and state.verify_report["checksums"]["old"] != state.verify_report["checksums"]["new"]
    refused = staged(CONTACTS, "contract", tenant=scratch)
    assert refused.code == 1 and "verify has not passed" in refused.err
    assert _plaintext_columns() == {"email", "phone"}


@pytest.mark.parametrize("name", [CONTACTS, TOTALS])
def test_rollback_after_contract_is_refused_with_a_clear_message(scratch: Tenant, name: str) -> None:
    customer_create(name="Ann", email="ann@example.com")
    _all_the_way(scratch, name)
    refused = staged(name, "rollback", tenant=scratch)
    assert refused.code == 1, refused
    assert "rollback refused: phase is contracted" in refused.err and "no earlier phase to return to" in refused.err
    assert _phase(name) == StagedPhase.CONTRACTED


def test_rollback_walks_back_one_phase_at_a_time_and_discards_at_the_start(scratch: Tenant) -> None:
    customer = customer_create(name="Ann", email="ann@example.com", phone="+44 20 7946 0000")
    for phase in ("expand", "backfill", "verify", "switch-reads"):
        assert staged(CONTACTS, phase, tenant=scratch).code == 0
    for expected in (StagedPhase.VERIFIED, StagedPhase.BACKFILLED, StagedPhase.EXPANDED):
        assert staged(CONTACTS, "rollback", tenant=scratch).code == 0
        assert _phase(CONTACTS) == expected
    assert Customer.objects.get(pk=customer.pk).email_ciphertext is not None
    assert staged(CONTACTS, "rollback", tenant=scratch).code == 0
    assert _phase(CONTACTS) == StagedPhase.ABSENT
    row = Customer.objects.get(pk=customer.pk)
    assert (row.email_ciphertext, row.phone_ciphertext, row.email_hash) == (None, None, None)
    assert not StagedMigrationState.objects.get(name=CONTACTS).discard_pending
    nothing = staged(CONTACTS, "rollback", tenant=scratch)
    assert nothing.code == 1 and "nothing to roll back" in nothing.err
    # And forward again, from scratch.
    _all_the_way(scratch, CONTACTS)
    assert customer_contact(customer=Customer.objects.get(pk=customer.pk)).phone == "+44 20 7946 0000"


def test_backfill_dry_run_writes_nothing_and_status_shows_the_state(scratch: Tenant) -> None:
    for n in range(7):
        customer_create(name=f"C{n}", email=f"c{n}@example.com")
    assert staged(CONTACTS, "expand", tenant=scratch).code == 0
    dry = staged(CONTACTS, "backfill", tenant=scratch, dry_run=True, batch=3)
    assert dry.code == 0 and "dry run: 7 rows looked at, 7 would be written" in dry.out, dry
    assert not Customer.objects.filter(email_ciphertext__isnull=False).exists()
    state = StagedMigrationState.objects.get(name=CONTACTS)
    assert (state.phase, state.cursor, state.rows_done) == (StagedPhase.EXPANDED, "", 0)
    assert staged(CONTACTS, "backfill", tenant=scratch, batch=3).code == 0
    state = StagedMigrationState.objects.get(name=CONTACTS)
    assert (state.rows_done, state.rows_written, state.rows_total) == (7, 7, 7)
    status = staged("status", tenant=scratch)
    assert status.code == 0
    line = next(ln for ln in status.out.splitlines() if CONTACTS in ln)
    assert "backfilled" in line and "7/7" in line


# --- Write semantics -------------------------------------------------------------------


def test_backfill_writes_only_what_is_absent_and_never_undoes_a_clear(scratch: Tenant) -> None:
    a = customer_create(name="A", email="a@example.com", phone="+1 555 0100")
    b = customer_create(name="B", email="b@example.com", phone="+1 555 0101")
    assert staged(CONTACTS, "expand", tenant=scratch).code == 0
    staged_phase_forget()
    # a: the new path changes only the phone; the email stays absent in the new columns.
    customer_contact_update(customer_id=a.pk, phone="+1 555 0199")
    row = Customer.objects.get(pk=a.pk)
    assert row.email_ciphertext is None and contact_decrypt(row.phone_ciphertext or "") == "+1 555 0199"
    # b: an explicit clear of the email (None) is not "leave unchanged" (UNSET).
    customer_contact_update(customer_id=b.pk, email=None, phone=UNSET)
    row = Customer.objects.get(pk=b.pk)
    assert row.email_ciphertext is not None and contact_decrypt(row.email_ciphertext) == "" and row.email_hash is None
    assert row.phone_ciphertext is None  # left unchanged: still absent, for the backfill
    assert staged(CONTACTS, "backfill", tenant=scratch).code == 0
    for customer, email, phone in ((a, "a@example.com", "+1 555 0199"), (b, "", "+1 555 0101")):
        row = Customer.objects.get(pk=customer.pk)
        assert (contact_decrypt(row.email_ciphertext or "x"), contact_decrypt(row.phone_ciphertext or "x")) == (email, phone)
        assert CustomerLegacyContact.objects.get(pk=customer.pk).email == email  # dual write kept the old one current
    assert staged(CONTACTS, "verify", tenant=scratch).code == 0


def test_an_update_that_changes_nothing_writes_nothing(scratch: Tenant) -> None:
    customer = customer_create(name="A", email="a@example.com", phone="+1 555 0100")
    for phase in ("expand", "backfill"):
        assert staged(CONTACTS, phase, tenant=scratch).code == 0
    with CaptureQueriesContext(connection) as queries:
        customer_contact_update(customer_id=customer.pk, email="a@example.com", phone=UNSET)
        customer_contact_update(customer_id=customer.pk)
    assert not [q for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")], queries.captured_queries
    with CaptureQueriesContext(connection) as queries:
        customer_contact_update(customer_id=customer.pk, phone="+1 555 0111")
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 2 and all("email" not in sql for sql in updates), updates  # old and new, the phone only


def test_the_backfill_never_overwrites_what_the_new_path_wrote(scratch: Tenant) -> None:
    """The race, made deterministic: the backfill read the plaintext, then the new path
    wrote, then the backfill's conditional write lands on a row that is no longer absent."""
    from wallets.contacts import CustomerContactsMigration

    customer = customer_create(name="A", email="old@example.com")
    assert staged(CONTACTS, "expand", tenant=scratch).code == 0
    staged_phase_forget()
    customer_contact_update(customer_id=customer.pk, email="new@example.com")
    with transaction.atomic():
        result = CustomerContactsMigration().backfill_batch(after="", limit=100, dry_run=False)
    row = Customer.objects.get(pk=customer.pk)
    assert contact_decrypt(row.email_ciphertext or "") == "new@example.com" and row.email_hash == email_lookup_hash("new@example.com")
    assert result.rows_written == 1  # the phone only (it was absent)


# --- Reads, lookups, masking -----------------------------------------------------------


def test_email_lookup_dedups_while_both_representations_exist_and_uses_the_hash_after(scratch: Tenant) -> None:
    old = customer_create(name="Old", email="Same@Example.com")
    assert [c.pk for c in customers_find_by_email(email="same@example.com")] == [old.pk]
    assert staged(CONTACTS, "expand", tenant=scratch).code == 0
    staged_phase_forget()
    new = customer_create(name="New", email="same@example.com")  # written to both
    # `old` is found by the plaintext only, `new` by both: each once.
    assert [c.pk for c in customers_find_by_email(email="SAME@example.com")] == [old.pk, new.pk]
    for phase in ("backfill", "verify", "switch-reads", "contract"):
        assert staged(CONTACTS, phase, tenant=scratch).code == 0
    with CaptureQueriesContext(connection) as queries:
        assert [c.pk for c in customers_find_by_email(email="same@example.com")] == [old.pk, new.pk]
    assert any("email_hash" in q["sql"] for q in queries.captured_queries)


def test_logs_and_the_admin_see_contacts_masked(scratch: Tenant, caplog: pytest.LogCaptureFixture) -> None:
    assert mask_email("alice@example.com") == "a***@example.com" and mask_phone("+81 90 1234 5678") == "***78"
    customer = customer_create(name="A", email="alice@example.com", phone="+81 90 1234 5678")
    with caplog.at_level(logging.INFO, logger="tally.contacts"):
        customer_contact_update(customer_id=customer.pk, email="bob@example.com")
    record = next(r for r in caplog.records if r.name == "tally.contacts")
    assert record.email == "b***@example.com" and "bob@example.com" not in caplog.text  # type: ignore[attr-defined]
    masked = customer_contact_masked(customer=Customer.objects.get(pk=customer.pk))
    assert (masked.email, masked.phone) == ("b***@example.com", "***78")


def test_contacts_are_encrypted_at_rest_and_survive_key_rotation(scratch: Tenant, settings: Any) -> None:
    from cryptography.fernet import Fernet

    customer = customer_create(name="A", email="alice@example.com")
    _all_the_way(scratch, CONTACTS)
    row = Customer.objects.get(pk=customer.pk)
    assert "alice" not in (row.email_ciphertext or "") and row.email_hash != "alice@example.com"
    # Rotation: a new key in front; tokens made under the old one still read, new ones use the new key.
    settings.TALLY_CONTACT_ENCRYPTION_KEYS = [Fernet.generate_key().decode(), *settings.TALLY_CONTACT_ENCRYPTION_KEYS]
    assert customer_contact(customer=row).email == "alice@example.com"
    customer_contact_update(customer_id=customer.pk, phone="+1 555 0100")
    newest = Fernet(settings.TALLY_CONTACT_ENCRYPTION_KEYS[0].encode())
    assert newest.decrypt((Customer.objects.get(pk=customer.pk).phone_ciphertext or "").encode()) == b"+1 555 0100"
    # Re-encrypt what is left under the old key; then the old key can go. A switched-off
    # tenant too: its contacts must read when it is switched on again.
    connection.set_schema_to_public()
    scratch.is_active = False
    scratch.save(update_fields=["is_active"])
    out = io.StringIO()
    call_command("contact_keys_rotate", stdout=out)
    assert f"{scratch.schema_name}: 1 customers re-encrypted" in out.getvalue()
    connection.set_tenant(scratch)
    row = Customer.objects.get(pk=customer.pk)
    assert newest.decrypt((row.email_ciphertext or "").encode()) == b"alice@example.com"
    out = io.StringIO()
    call_command("contact_keys_rotate", tenant=scratch.schema_name, stdout=out)
    assert "0 customers re-encrypted" in out.getvalue()  # nothing left to rewrite: no write
    connection.set_tenant(scratch)
    settings.TALLY_CONTACT_ENCRYPTION_KEYS = settings.TALLY_CONTACT_ENCRYPTION_KEYS[:1]
    assert customer_contact(customer=Customer.objects.get(pk=customer.pk)).email == "alice@example.com"


def test_a_new_tenant_stores_contacts_encrypted_from_its_first_customer(django_db_setup: None, django_db_blocker: Any) -> None:
    """A new tenant starts `customer_contacts` contracted (as `webhook_secrets` starts
    sealed): its first customer's email and phone are only in the encrypted columns, the
    plaintext ones stay empty. New tenants used to start at `absent`, in plaintext."""
    with django_db_blocker.unblock(), scratch_tenants(1, prefix="test_nc", legacy=()) as (tenant,):
        connection.set_tenant(tenant)
        try:
            state = StagedMigrationState.objects.get(name=CONTACTS)
            assert state.phase == StagedPhase.CONTRACTED and state.history[-1]["note"] == "no old data: new representation only"
            customer = customer_create(name="First", email="First@Example.com", phone="+81 90 1111 2222")
            with connection.cursor() as cursor:
                cursor.execute("SELECT email, phone, email_ciphertext, phone_ciphertext FROM wallets_customer WHERE id = %s", [customer.pk])
                email, phone, email_token, phone_token = cursor.fetchone()
            assert (email, phone) == ("", "")
            assert contact_decrypt(email_token) == "First@Example.com" and contact_decrypt(phone_token) == "+81 90 1111 2222"
            assert customer_contact(customer=Customer.objects.get(pk=customer.pk)) == Contact("First@Example.com", "+81 90 1111 2222")
            assert [c.pk for c in customers_find_by_email(email="first@example.com")] == [customer.pk]
            customer_contact_update(customer_id=customer.pk, phone="+81 90 3333 4444")
            assert CustomerLegacyContact.objects.filter(pk=customer.pk).values_list("email", "phone").get() == ("", "")
        finally:
            connection.set_schema_to_public()


# --- Settlement totals -----------------------------------------------------------------


def test_daily_totals_read_the_same_from_the_ledger_and_from_the_summary(scratch: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    merchant_id = terminal.store.merchant_id
    p1 = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=700)
    assert staged(TOTALS, "expand", tenant=scratch).code == 0
    staged_phase_forget()
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=300)
    refund_create(payment=p1, amount=200)
    from_ledger = merchant_daily_totals(merchant_id=merchant_id, asset_code="JPY")
    assert [(t.credited, t.debited, t.net, t.entries) for t in from_ledger] == [(1000, 200, 800, 3)]
    for phase in ("backfill", "verify", "switch-reads"):
        assert staged(TOTALS, phase, tenant=scratch).code == 0
    staged_phase_forget()
    with CaptureQueriesContext(connection) as queries:
        assert merchant_daily_totals(merchant_id=merchant_id, asset_code="JPY") == from_ledger
    assert any("wallets_merchantdailytotal" in q["sql"] for q in queries.captured_queries)
    assert not any("wallets_ledgerentry" in q["sql"] for q in queries.captured_queries)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=5)
    assert [(t.credited, t.entries) for t in merchant_daily_totals(merchant_id=merchant_id, asset_code="JPY")] == [(1005, 4)]
    assert AccountDailyTotal.objects.filter(account__merchant_id=merchant_id).count() >= 1
    with schema_context(scratch.schema_name):
        assert staged(TOTALS, "verify", tenant=scratch).code == 0


def test_the_totals_backfill_walks_a_long_history_in_day_windows(scratch: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window's lock covers a few days of a few merchants; days before, after and across
    windows all come out exact, with no row twice."""
    from datetime import timedelta

    from django.utils import timezone

    from wallets.daily_totals import MerchantDailyTotalsMigration
    from wallets.models import Account, SystemRole
    from wallets.services.ledger import Leg, ledger_post

    monkeypatch.setattr(MerchantDailyTotalsMigration, "window_days", 2)
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    merchants = [TerminalFactory().store.merchant for _ in range(3)]
    with transaction.atomic():
        for n, merchant in enumerate(merchants):
            for days_ago in (9, 6, 5, 1, 0):
                account = Account.objects.get(merchant_id=merchant.pk)
                created = timezone.now() - timedelta(days=days_ago, minutes=n)
                legs = [Leg(account, "JPY", 100 + days_ago), Leg(source, "JPY", -(100 + days_ago))]
                ledger_post(kind="adjustment", reference=f"adj_{n}_{days_ago}", legs=legs, created=created)
    assert staged(TOTALS, "expand", tenant=scratch).code == 0
    run = staged(TOTALS, "backfill", tenant=scratch, batch=2)
    assert run.code == 0, run
    state = StagedMigrationState.objects.get(name=TOTALS)
    assert (state.rows_done, state.rows_total) == (3, 3)
    assert AccountDailyTotal.objects.count() == 15  # 3 merchants x 5 days, one row each
    assert staged(TOTALS, "verify", tenant=scratch).code == 0
    for _ in range(2):  # back to expanded (the cursor starts over), then backfill again: nothing to write
        assert staged(TOTALS, "rollback", tenant=scratch).code == 0
    assert staged(TOTALS, "backfill", tenant=scratch, batch=2).code == 0
    state = StagedMigrationState.objects.get(name=TOTALS)
    assert (state.phase, state.rows_done, state.rows_written) == (StagedPhase.BACKFILLED, 3, 0)


class _Stop(Exception):
    pass


def _merchants_with_history(count: int, days_ago: tuple[int, ...]) -> list[str]:
    """`count` merchants, each credited once on each of `days_ago` (posted in the past,
    before expand: only the backfill can bring them to the summary). Their account ids."""
    from datetime import timedelta

    from django.utils import timezone

    from wallets.models import Account, SystemRole
    from wallets.services.ledger import Leg, ledger_post

    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    accounts = []
    with transaction.atomic():
        for n in range(count):
            account = Account.objects.get(merchant_id=TerminalFactory().store.merchant_id)
            accounts.append(account.pk)
            for ago in days_ago:
                created = timezone.now() - timedelta(days=ago, minutes=n)
                legs = [Leg(account, "JPY", 100 + ago), Leg(source, "JPY", -(100 + ago))]
                ledger_post(kind="adjustment", reference=f"adj_{n}_{ago}", legs=legs, created=created)
    return accounts


@pytest.mark.parametrize(("first_batch", "then_batch"), [(2, 5), (1, 3), (3, 1)])
def test_the_totals_backfill_resumed_with_another_batch_skips_no_merchant_day(
    scratch: Tenant, monkeypatch: pytest.MonkeyPatch, first_batch: int, then_batch: int
) -> None:
    """Stopped after two batches of one --batch and resumed with another: every (merchant,
    asset, day) is in the summary, as a full recompute from the ledger has it."""
    from datetime import UTC, datetime, timedelta

    from wallets.daily_totals import MerchantDailyTotalsMigration, merchant_daily_totals_differences
    from wallets.staged.runner import staged_backfill

    monkeypatch.setattr(MerchantDailyTotalsMigration, "window_days", 2)
    _merchants_with_history(5, (9, 6, 5, 1, 0))
    assert staged(TOTALS, "expand", tenant=scratch).code == 0
    batches = 0

    def stop_after_two(done: int, total: int, rate: float) -> None:
        nonlocal batches
        batches += 1
        if batches == 2:
            raise _Stop

    with pytest.raises(_Stop):
        staged_backfill(migration=MerchantDailyTotalsMigration(), batch=first_batch, progress=stop_after_two)
    state = StagedMigrationState.objects.get(name=TOTALS)
    assert state.phase == StagedPhase.EXPANDED and state.cursor  # stopped partway, the cursor kept
    resumed = staged(TOTALS, "backfill", tenant=scratch, batch=then_batch)
    assert resumed.code == 0, resumed
    state = StagedMigrationState.objects.get(name=TOTALS)
    assert (state.phase, state.rows_done, state.rows_total) == (StagedPhase.BACKFILLED, 5, 5)
    today = datetime.now(UTC).date()
    assert merchant_daily_totals_differences(day_from=today - timedelta(days=30), day_to=today + timedelta(days=1)) == []
    assert AccountDailyTotal.objects.count() == 25  # 5 merchants x 5 days, each once
    verified = staged(TOTALS, "verify", tenant=scratch)
    assert verified.code == 0, verified


def test_a_totals_cursor_names_a_merchant_and_a_day_and_the_earlier_form_resumes_at_its_batchs_start(
    scratch: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cursor between windows is `<account>/<day>`. One of the earlier form,
    `<account>@<day>`, whose day applied to the batch after <account>, resumes with that
    batch's merchants from their first day (here the first batch: `@<day>`)."""
    from datetime import UTC, datetime, timedelta

    from wallets.daily_totals import MerchantDailyTotalsMigration

    monkeypatch.setattr(MerchantDailyTotalsMigration, "window_days", 2)
    accounts = sorted(_merchants_with_history(3, (6, 1)))
    assert staged(TOTALS, "expand", tenant=scratch).code == 0
    staged_phase_forget()
    with transaction.atomic():
        first = MerchantDailyTotalsMigration().backfill_batch(after="", limit=2, dry_run=True)
    assert first.cursor is not None and first.cursor.startswith(f"{accounts[0]}/")
    StagedMigrationState.objects.filter(name=TOTALS).update(cursor=f"@{datetime.now(UTC).date() - timedelta(days=2)}")
    assert staged(TOTALS, "backfill", tenant=scratch, batch=2).code == 0
    assert AccountDailyTotal.objects.count() == 6
    assert staged(TOTALS, "verify", tenant=scratch).code == 0


def test_reconciliation_reads_the_daily_totals_once_reads_switched(scratch: Tenant) -> None:
    from reconciliation.models import RunTrigger
    from reconciliation.services import reconciliation_run_execute, reconciliation_run_request

    def findings() -> dict[str, int]:
        run = reconciliation_run_execute(run_id=reconciliation_run_request(trigger=RunTrigger.COMMAND).pk)
        return {kind: n for kind, n in run.report["by_kind"].items() if kind == "daily_total_mismatch"}

    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=700)
    for phase in ("expand", "backfill", "verify", "switch-reads"):
        assert staged(TOTALS, phase, tenant=scratch).code == 0
    staged_phase_forget()
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=300)
    assert findings() == {}
    # A summary row edited behind the posting's back: the history endpoint would show it.
    AccountDailyTotal.objects.filter(account__merchant_id=terminal.store.merchant_id).update(credited=F("credited") + 1)
    found = findings()
    days = AccountDailyTotal.objects.filter(account__merchant_id=terminal.store.merchant_id).values("day").distinct().count()
    assert found == {"daily_total_mismatch": days}
