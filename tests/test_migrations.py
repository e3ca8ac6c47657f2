"""Migrations: the squashed payments chain creates no PL/pgSQL payment function; a
database migrated with the old chain (0001-0009 as files) upgrades to the same schema as
a fresh one (tests/tools/payments_squash_proof.py); and the derived carbon aggregate's
migration goes back (refilling the table from the payments) and forward again, on a
tenant of its own with payments in it, so the backward step meets real rows; and the
later migrations' deploy-safety and data steps, each its own test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from payments.services.adjustments import adjustment_create
from payments.services.charges import payment_create
from payments.services.refunds import refund_create
from tenants.models import Tenant
from tenants.services import tenant_create
from tests.conftest import in_tenant
from tests.tools import payments_squash_proof
from wallets.services.principals import customer_create, merchant_create, staff_member_get_or_create, store_create, terminal_create

ROOT = Path(__file__).resolve().parent.parent
BEFORE_CARBON_DERIVED = "0006_reference_targets_undeletable"


@pytest.fixture
def scratch_tenant(django_db_setup: None, django_db_blocker: Any) -> Iterator[Tenant]:
    with django_db_blocker.unblock():
        schema = f"test_migr_{uuid.uuid4().hex[:8]}"
        tenant = tenant_create(schema_name=schema, domain=f"{schema}.test.localhost", name="Migrations", main_currency="JPY")
        tenant.charge_by_customer_id = True  # the test pays by customer id
        tenant.save(update_fields=["charge_by_customer_id"])
        try:
            yield tenant
        finally:
            connection.set_schema_to_public()
            tenant.delete(force_drop=True)


def _function_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema() AND p.proname = %s",
            [name],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        row = cursor.fetchone()
    return bool(row and row[0])


def _migrate(schema: str, *target: str) -> None:
    """`target` is (app, migration); none means every app to its head."""
    call_command("migrate_schemas", *target, schema_name=schema, interactive=False, verbosity=0)


def test_the_squashed_chain_creates_no_payment_function_and_is_recorded(scratch_tenant: Tenant) -> None:
    with in_tenant(scratch_tenant):
        assert not _function_exists("tally_payment_create") and not _function_exists("tally_customer_reward_credit")
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM django_migrations WHERE app = 'payments' AND name = %s", [payments_squash_proof.SQUASH])
            assert cursor.fetchone() == (1,)
    assert not (ROOT / payments_squash_proof.REMOVED).exists(), "the replaced migrations are gone"


def test_the_carbon_aggregate_goes_back_refilled_and_forward(scratch_tenant: Tenant) -> None:
    schema = scratch_tenant.schema_name
    with in_tenant(scratch_tenant):
        customer = customer_create(name="Mig")
        terminal = terminal_create(store=store_create(merchant=merchant_create(name="Shop"), name="S"), name="T")
        adjustment_create(
            staff=staff_member_get_or_create(username="mig"), customer=customer, asset_code="JPY", amount=5_000,
            direction="credit", reason="test",
        )
        payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=2_000)  # 1,000 g of CO2
        refund_create(payment=payment, amount=500)  # 250 g back
        assert not _table_exists("wallets_carbonimpact")

    _migrate(schema, "wallets", BEFORE_CARBON_DERIVED)
    with in_tenant(scratch_tenant):
        with connection.cursor() as cursor:
            cursor.execute("SELECT SUM(grams) FROM wallets_carbonimpact")
            row = cursor.fetchone()
        assert row is not None and row[0] == 2 * 750  # the customer's and the merchant's aggregate, refilled

    _migrate(schema)
    with in_tenant(scratch_tenant):
        assert not _table_exists("wallets_carbonimpact")
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)


def test_the_payouts_migration_gives_a_tenant_its_in_transit_account_and_a_payable_main_currency(scratch_tenant: Tenant) -> None:
    from wallets.models import BALANCE_SHARDS, Account, Asset, Balance

    schema = scratch_tenant.schema_name
    _migrate(schema, "wallets", "0015_staff_login_deactivation_revokes_keys")
    with in_tenant(scratch_tenant):
        with connection.cursor() as cursor:  # as a tenant bootstrapped before payouts: no such account
            cursor.execute("SET session_replication_role = replica")  # past the guard refusing to delete accounts
            in_transit = "SELECT id FROM wallets_account WHERE system_role = 'payouts_in_transit'"
            cursor.execute(f"DELETE FROM wallets_balance WHERE account_id IN ({in_transit})")
            cursor.execute("DELETE FROM wallets_account WHERE system_role = 'payouts_in_transit'")
            cursor.execute("SET session_replication_role = DEFAULT")
    _migrate(schema)
    with in_tenant(scratch_tenant):
        account = Account.objects.get(system_role="payouts_in_transit")
        assert Balance.objects.filter(account=account).count() == 3 * BALANCE_SHARDS  # JPY, POINT, CARBON
        assert list(Asset.objects.filter(payable=True).values_list("code", flat=True)) == ["JPY"]


@pytest.mark.skipif(shutil.which("pg_dump") is None, reason="needs pg_dump")
def test_a_database_migrated_with_the_old_chain_upgrades_to_the_fresh_schema(django_db_setup: None) -> None:
    try:
        payments_squash_proof.old_commit_default()
    except (subprocess.CalledProcessError, SystemExit, FileNotFoundError):
        pytest.skip("needs the git history (the code before the squash)")
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/postgres"
    result = subprocess.run([sys.executable, "tests/tools/payments_squash_proof.py"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "DATABASE_URL": url})
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert "tenant_template: " in result.stdout and "identical" in result.stdout and "PROOF OK" in result.stdout


@pytest.mark.django_db
def test_an_event_written_by_the_code_before_sequences_goes_in_during_the_deploy(tenant: Tenant) -> None:
    """The code before `object_id` and `sequence` existed inserts events without them: the
    database's own defaults must take them, or every payment on that code fails mid-deploy."""
    from django.utils import timezone

    from payments.models import OutboxEvent

    old_columns = [f.column for f in OutboxEvent._meta.concrete_fields if f.name not in ("object_id", "sequence")]
    values = {"id": "evt_before_sequences", "topic": "payment.succeeded", "payload": "{}", "created": timezone.now(),
              "published_at": None, "attempts": 0, "last_error": "", "next_attempt_at": timezone.now()}
    assert set(values) >= set(old_columns) - {"dead_at"}, old_columns  # the test names every column the old code wrote
    columns = [c for c in old_columns if c in values]
    with in_tenant(tenant), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO payments_outboxevent ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
            [values[c] for c in columns],
        )
        event = OutboxEvent.objects.get(pk="evt_before_sequences")
    assert (event.object_id, event.sequence) == ("", 0)


def test_the_charged_amount_migration_gives_up_on_a_queued_lock_rather_than_block_top_ups(tenant: Tenant) -> None:
    """0021 adds columns to payments_topup (ACCESS EXCLUSIVE): queued behind a long reader,
    it would hold every top-up behind it. It sets a short lock_timeout first, in its own
    transaction; and the charged currency column is as long as an asset code."""
    from io import StringIO

    from payments.models import TopUp
    from wallets.models import Asset

    out = StringIO()
    call_command("sqlmigrate", "payments", "0021_topup_charged_amount", stdout=out)
    sql = out.getvalue()
    assert sql.lstrip().startswith("BEGIN;") and "SET LOCAL lock_timeout = '5s'" in sql, sql
    assert sql.index("SET LOCAL lock_timeout") < sql.index("ALTER TABLE"), sql
    assert 'ADD COLUMN "psp_charged_currency" varchar(12)' in sql, sql
    assert TopUp._meta.get_field("psp_charged_currency").max_length == Asset._meta.get_field("code").max_length


def test_the_fees_migration_is_one_transaction_that_runs_again_and_validates_after(tenant: Tenant) -> None:
    """0024 (payments and refunds, the hottest tables) is atomic, so a run that gave up on its
    lock_timeout leaves nothing and runs again; its CHECKs come NOT VALID, validated by 0025
    outside that transaction. New NOT NULL columns have database defaults, so the code before
    them keeps inserting during a rolling deploy."""
    from io import StringIO

    out = StringIO()
    call_command("sqlmigrate", "payments", "0024_fees", stdout=out)
    sql = out.getvalue()
    assert sql.lstrip().startswith("BEGIN;") and sql.rstrip().endswith("COMMIT;"), sql
    assert sql.index("SET LOCAL lock_timeout = '5s'") < sql.index("CREATE TABLE") < sql.index("ALTER TABLE payments_payment ADD COLUMN"), sql
    assert sql.count("NOT VALID") == 3 and "VALIDATE" not in sql, sql
    out = StringIO()
    call_command("sqlmigrate", "payments", "0025_fees_validate", stdout=out)
    assert out.getvalue().count("VALIDATE CONSTRAINT") == 3 and "BEGIN;" not in out.getvalue()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, column_default FROM information_schema.columns"
            " WHERE (table_schema = 'public' AND table_name = 'tenants_tenant' AND column_name IN ('settlement_delay_days', 'refund_fee_policy'))"
            " OR (table_schema = %s AND table_name IN ('payments_payment', 'payments_refund') AND column_name IN ('fee', 'fee_refunded'))",
            [connection.schema_name],
        )
        defaults = {(table, column): default for table, column, default in cursor.fetchall()}
    assert defaults == {
        ("tenants_tenant", "settlement_delay_days"): "2", ("tenants_tenant", "refund_fee_policy"): "'proportional'::character varying",
        ("payments_payment", "fee"): "0", ("payments_payment", "fee_refunded"): "0", ("payments_refund", "fee"): "0",
    }, defaults


def test_the_funds_kinds_migration_gives_earlier_daily_totals_their_returned_payout_money(tenant: Tenant) -> None:
    """0018 adds `returned` with a database default (the code before it keeps inserting), and
    fills it on the rows written before it from the ledger's PAYOUT_BACK credits, spread over
    a day's shard rows up to each one's credited; run again, it sets the same."""
    import importlib
    from datetime import timedelta

    from django.db.migrations.loader import MigrationLoader
    from django.utils import timezone

    from wallets.daily_totals import MIGRATION, merchant_daily_totals_differences
    from wallets.models import Account, AccountDailyTotal, StagedMigrationState, StagedPhase, SystemRole
    from wallets.services.ledger import Leg, ledger_post
    from wallets.staged.phases import staged_phase_forget

    StagedMigrationState.objects.update_or_create(name=MIGRATION, defaults={"phase": StagedPhase.EXPANDED})
    staged_phase_forget()
    try:
        account = Account.objects.get(merchant=merchant_create(name="Returned"))
        adjustments, in_transit = (Account.objects.get(system_role=role) for role in (SystemRole.ADJUSTMENTS, SystemRole.PAYOUTS_IN_TRANSIT))
        day = timezone.now() - timedelta(days=1)
        ledger_post(kind="adjustment", reference="adj_m", legs=[Leg(account, "JPY", 200), Leg(adjustments, "JPY", -200)], created=day)
        ledger_post(kind="payout_back", reference="po_m", legs=[Leg(account, "JPY", 500), Leg(in_transit, "JPY", -500)], created=day)
    finally:
        staged_phase_forget()
    [row] = AccountDailyTotal.objects.filter(account=account)
    assert (row.credited, row.returned) == (700, 500)  # the posting keeps it
    # As the code before 0018 left the day: no `returned`, and its credits on two shard rows.
    row.delete()
    AccountDailyTotal.objects.create(account=account, asset_id="JPY", day=row.day, shard=0, credited=300, debited=0, entries=1)
    AccountDailyTotal.objects.create(account=account, asset_id="JPY", day=row.day, shard=5, credited=400, debited=0, entries=1)
    [(_, ledger, summary)] = merchant_daily_totals_differences(day_from=row.day, day_to=row.day)  # verify and reconciliation see it
    assert (ledger, summary) == ((700, 0, 2, 500), (700, 0, 2, 0))
    fill = importlib.import_module("wallets.migrations.0018_funds_kinds").returned_fill
    # The models as 0018 knew them (the summary's model has been renamed since).
    state_apps = MigrationLoader(connection).project_state(("wallets", "0018_funds_kinds")).apps
    for _ in range(2):
        fill(state_apps, connection.schema_editor())
        rows = AccountDailyTotal.objects.filter(account=account).order_by("shard")
        assert [(r.shard, r.credited, r.returned) for r in rows] == [(0, 300, 300), (5, 400, 200)]
    assert merchant_daily_totals_differences(day_from=row.day, day_to=row.day) == []


def test_the_funds_kinds_migration_goes_back_and_runs_again(scratch_tenant: Tenant) -> None:
    """0018 is not atomic (its index is built CONCURRENTLY): back and forward twice, each
    step re-runnable, it leaves the column with its database default (the code before it
    keeps inserting), its CHECK validated and the partial index valid."""
    schema = scratch_tenant.schema_name
    for _ in range(2):
        _migrate(schema, "wallets", "0017_payouts")
        with in_tenant(scratch_tenant), connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass('ledgertxn_payout_back') IS NULL")
            assert cursor.fetchone() == (True,)
        _migrate(schema)
    with in_tenant(scratch_tenant), connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_default FROM information_schema.columns WHERE table_schema = %s AND table_name = 'wallets_merchantdailytotal'"
            " AND column_name = 'returned'",
            [schema],
        )
        assert cursor.fetchone() == ("0",)
        cursor.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'merchantdailytotal_returned_in_credited'"
                       " AND conrelid = 'wallets_merchantdailytotal'::regclass")
        assert cursor.fetchone() == (True,)
        cursor.execute("SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index WHERE indexrelid = 'ledgertxn_payout_back'::regclass")
        valid, definition = cursor.fetchone()
        assert valid and "WHERE ((kind)::text = 'payout_back'::text)" in definition, definition


def _payout_catalog() -> tuple[dict[str, bool], dict[str, bool], dict[str, str | None]]:
    """payments_payout's operator-queue constraints (name: validated), indexes (name: valid)
    and new text columns' database defaults, in the current schema."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT con.conname, con.convalidated FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname = 'payments_payout'"
            " AND (con.conname LIKE 'payments_payout_review%%' OR con.conname = 'payout_review_checker_not_maker')"
        )
        constraints = {str(name): bool(valid) for name, valid in cursor.fetchall()}
        cursor.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relname IN ('payout_return_owed', 'payout_in_review')"
        )
        indexes = {str(name): bool(valid) for name, valid in cursor.fetchall()}
        cursor.execute(
            "SELECT column_name, column_default FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = 'payments_payout' AND column_name IN ('return_failure_code', 'review_reason', 'review_outcome')"
        )
        defaults = {str(column): default for column, default in cursor.fetchall()}
    return constraints, indexes, defaults


def test_the_payout_review_migration_adds_columns_in_one_short_transaction_then_builds_and_validates_concurrently(
    scratch_tenant: Tenant,
) -> None:
    """0027 (payments_payout takes every payout's writes) is one transaction under a short
    lock_timeout: columns the code before it can insert without, its foreign keys and CHECK
    NOT VALID, no index build; 0028, outside any transaction, builds the partial indexes
    CONCURRENTLY and validates the constraints. Down to 0026 and up again."""
    from io import StringIO

    with in_tenant(scratch_tenant):  # the tenant apps' SQL, as migrate_schemas runs it in a tenant's schema
        out = StringIO()
        call_command("sqlmigrate", "payments", "0027_payout_review", stdout=out)
        sql = out.getvalue()
        assert sql.lstrip().startswith("BEGIN;") and sql.rstrip().endswith("COMMIT;"), sql
        assert sql.index("SET LOCAL lock_timeout = '5s'") < sql.index("ALTER TABLE payments_payout"), sql
        assert sql.count("NOT VALID") == 3 and "VALIDATE" not in sql and "CREATE INDEX" not in sql, sql
        out = StringIO()
        call_command("sqlmigrate", "payments", "0028_payout_review_fixes", stdout=out)
        sql = out.getvalue()
        assert "BEGIN;" not in sql and sql.count("CREATE INDEX CONCURRENTLY") == 2 and sql.count("VALIDATE CONSTRAINT") == 3, sql

    schema = scratch_tenant.schema_name
    with in_tenant(scratch_tenant):
        assert _payout_catalog() == (
            {"payments_payout_review_maker_id_09ae09a9_fk_wallets_s": True, "payments_payout_review_resolved_by_i_59dfda4c_fk_wallets_s": True,
             "payout_review_checker_not_maker": True},
            {"payout_return_owed": True, "payout_in_review": True},
            {"return_failure_code": "''::character varying", "review_reason": "''::character varying",
             "review_outcome": "''::character varying"},
        )
    _migrate(schema, "payments", "0026_payouts")
    with in_tenant(scratch_tenant):
        assert _payout_catalog() == ({}, {}, {})
    _migrate(schema, "payments", "0027_payout_review")
    with in_tenant(scratch_tenant):
        constraints, indexes, _ = _payout_catalog()
        assert set(constraints.values()) == {False} and len(constraints) == 3 and indexes == {}
    _migrate(schema)
    with in_tenant(scratch_tenant):
        constraints, indexes, _ = _payout_catalog()
        assert set(constraints.values()) == {True} and len(constraints) == 3 and indexes == {"payout_return_owed": True, "payout_in_review": True}


def _catalog(schema: str) -> tuple[dict[str, int], set[str], dict[str, int]]:
    """The schema's relations by kind, its pattern_ops indexes, and its foreign keys' oids by name."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind, count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                       " WHERE n.nspname = %s GROUP BY relkind", [schema])
        kinds = dict(cursor.fetchall())
        cursor.execute(
            """
            SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_namespace n ON n.oid = i.relnamespace
              JOIN pg_opclass o ON o.oid = ANY (x.indclass::oid[])
             WHERE n.nspname = %s AND o.opcname IN ('varchar_pattern_ops', 'text_pattern_ops')
            """,
            [schema],
        )
        twins = {name for (name,) in cursor.fetchall()}
        cursor.execute("SELECT conname, c.oid FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
                       " WHERE n.nspname = %s AND contype = 'f'", [schema])
        foreign_keys = dict(cursor.fetchall())
    return kinds, twins, foreign_keys


def test_the_lean_index_migrations_drop_the_old_indexes_and_leave_the_foreign_keys_alone(scratch_tenant: Tenant) -> None:
    """A tenant made before them (its foreign-key indexes there, pattern_ops twins beside
    them, as the old schema editor built) ends as a new one: the same relations, no twin,
    and every foreign key the same constraint (never dropped and re-added, which would check
    every row under a lock)."""
    schema = scratch_tenant.schema_name
    connection.set_schema_to_public()
    new_tenant = _catalog(schema)
    _migrate(schema, "reconciliation", "0002_books")
    _migrate(schema, "wallets", "0020_ledgerentry_created_brin")  # and payments 0029, webhooks 0009 with it
    with in_tenant(scratch_tenant), connection.cursor() as cursor:
        for table, column in (("payments_payout", "id"), ("wallets_apikey", "key_hash"), ("auth_user", "username"),
                              ("webhooks_webhookdelivery", "id"), ("payments_payout", "ledger_transaction_id")):
            cursor.execute(f"CREATE INDEX {table}_{column}_twin_like ON {table} ({column} varchar_pattern_ops)")
    connection.set_schema_to_public()
    before = _catalog(schema)
    assert before[0]["i"] == new_tenant[0]["i"] + 28 + 5 and len(before[1]) == 5  # the 28 foreign-key indexes back, the 5 twins
    _migrate(schema)
    after = _catalog(schema)
    assert after == (new_tenant[0], set(), before[2])
    assert after[2].keys() == new_tenant[2].keys()
