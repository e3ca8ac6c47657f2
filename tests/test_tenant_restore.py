"""`manage.py tenant_restore` (tenants/restore.py) against real PostgreSQL: a tenant's schema
put back as it was at an instant T from a copy of the database taken then, the other
tenant's later payments untouched; a live schema kept aside; a dry run; the refusals.

The copy at T is what a point-in-time restore gives (docs/RELIABILITY.md, "Restore one
tenant"): here `pg_dump -Fc` of the test database at T restored into a scratch database.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django_tenants.utils import schema_context
from psycopg.conninfo import make_conninfo

from payments.services.charges import payment_create
from reconciliation.services import reconciliation_restored_schema_check
from tenants.models import Tenant
from tenants.restore import TenantRestoreRefused, TenantRestoreReport, tenant_restore
from tenants.services import tenant_create
from tenants.signals import StagedCheck, tenant_restore_staged
from tests.factories import CustomerFactory, TerminalFactory, fund
from wallets.models import ApiKey, Customer, Terminal
from wallets.services.principals import api_key_create, staff_member_get_or_create

RESTORED, OTHER = "rst_a", "rst_b"
pytestmark = pytest.mark.skipif(not (Path(settings.TALLY_PG_BIN_DIR) / "pg_dump").exists(), reason="needs the server's pg_dump")


def _dsn(dbname: str) -> str:
    db = connection.settings_dict
    parts = {"host": db.get("HOST"), "port": str(db.get("PORT") or ""), "user": db.get("USER"), "password": db.get("PASSWORD"), "dbname": dbname}
    return make_conninfo("", **{k: v for k, v in parts.items() if v})


def _schemas_like(prefix: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s) ORDER BY 1", [prefix])
        return [str(name) for (name,) in cursor.fetchall()]


def _drop(*schemas: str) -> None:
    connection.set_schema_to_public()
    with connection.cursor() as cursor:
        for schema in schemas:
            cursor.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _ledger(schema: str) -> tuple[Any, ...]:
    """The tenant's ledger, balances and payments, every column, as one comparable value."""
    with connection.cursor() as cursor:
        found = []
        for table in ("wallets_ledgerentry", "wallets_balance", "payments_payment", "wallets_ledgertransaction"):
            cursor.execute(f'SELECT count(*), md5(coalesce(string_agg(t::text, \'|\' ORDER BY t.id), \'\')) FROM "{schema}".{table} t')
            found.append((table, *cursor.fetchone()))
        return tuple(found)


@dataclass
class World:
    source: str  # DSN of the copy taken at T
    ledger_at_t: tuple[Any, ...]
    other_after_t: tuple[Any, ...]
    payer: dict[str, tuple[Customer, Terminal]]
    keys: dict[str, str]  # in RESTORED at T: "customer" and "staff" API key ids, "staff_user" the staff login's id


def _pay(schema: str, world: dict[str, tuple[Customer, Terminal]], amount: int) -> None:
    with schema_context(schema):
        customer, terminal = world[schema]
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=amount)


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    """Two tenants with payments; the database copied at T; more payments in both after T."""
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        Tenant.objects.filter(schema_name__in=[RESTORED, OTHER]).delete()
        _drop(RESTORED, OTHER, *_schemas_like(f"{RESTORED}_"))
        payer: dict[str, tuple[Customer, Terminal]] = {}
        for schema in (RESTORED, OTHER):
            tenant_create(schema_name=schema, domain=f"{schema}.test.localhost", name=schema, main_currency="JPY")
            with schema_context(schema):
                customer, terminal = CustomerFactory(), TerminalFactory()
                fund(customer, 100_000)
                payer[schema] = (customer, terminal)
                if schema == RESTORED:
                    staff = staff_member_get_or_create(username="rst-ops")
                    keys = {"customer": api_key_create(principal=customer)[0].pk, "staff": api_key_create(principal=staff)[0].pk,
                            "staff_user": str(staff.user_id)}
        connection.set_schema_to_public()
        Tenant.objects.filter(schema_name__in=[RESTORED, OTHER]).update(charge_by_customer_id=True)
        for amount in (1_000, 2_000, 3_000):
            _pay(RESTORED, payer, amount)
            _pay(OTHER, payer, amount)

        # T: the copy.
        live_name = str(connection.settings_dict["NAME"])
        source_name = f"{live_name}_src"
        ledger_at_t = _ledger(RESTORED)
        with psycopg.connect(_dsn("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{source_name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{source_name}" TEMPLATE template0')
        dump = subprocess.run([f"{settings.TALLY_PG_BIN_DIR}/pg_dump", "-Fc", "-d", _dsn(live_name)], check=True, capture_output=True)
        subprocess.run([f"{settings.TALLY_PG_BIN_DIR}/pg_restore", "--no-owner", "--no-acl", "-d", _dsn(source_name)],
                       input=dump.stdout, check=True, capture_output=True)

        for amount in (4_000, 5_000):
            _pay(RESTORED, payer, amount)
            _pay(OTHER, payer, amount)
        assert _ledger(RESTORED) != ledger_at_t
        try:
            yield World(source=_dsn(source_name), ledger_at_t=ledger_at_t, other_after_t=_ledger(OTHER), payer=payer, keys=keys)
        finally:
            connection.set_schema_to_public()
            Tenant.objects.filter(schema_name__in=[RESTORED, OTHER]).delete()
            _drop(RESTORED, OTHER, *_schemas_like(f"{RESTORED}_"))
            with psycopg.connect(_dsn("postgres"), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{source_name}" WITH (FORCE)')


@pytest.fixture
def restoring(world: World, django_db_blocker: Any) -> Iterator[World]:
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        yield world
        connection.set_schema_to_public()


def _restore(world: World, *extra: str, schema: str = RESTORED) -> str:
    out = io.StringIO()
    call_command("tenant_restore", "--schema", schema, "--source", world.source, *extra, stdout=out, stderr=io.StringIO())
    connection.set_schema_to_public()
    return out.getvalue()


def _reconcile_clean(schema: str) -> None:
    out = io.StringIO()
    call_command("reconcile", tenant=schema, stdout=out, stderr=io.StringIO())  # raises CommandError on findings
    assert f"{schema}: run" in out.getvalue() and "clean" in out.getvalue()
    connection.set_schema_to_public()


def test_a_dropped_tenant_comes_back_as_it_was_at_the_instant_and_the_other_keeps_its_later_payments(restoring: World) -> None:
    _drop(RESTORED)  # the mistake
    said = _restore(restoring)
    assert f"restored {RESTORED}" in said and "the live schema was gone" in said
    assert _ledger(RESTORED) == restoring.ledger_at_t
    assert _ledger(OTHER) == restoring.other_after_t
    _reconcile_clean(RESTORED)
    _reconcile_clean(OTHER)
    assert Tenant.objects.get(schema_name=RESTORED).is_active
    assert _schemas_like(f"{RESTORED}_") == []  # no staging left behind
    # The restored tenant takes payments again.
    _pay(RESTORED, restoring.payer, 700)
    _reconcile_clean(RESTORED)


def test_a_live_schema_is_swapped_out_and_kept_aside(restoring: World) -> None:
    _pay(RESTORED, restoring.payer, 999)  # after T: only in the schema replaced
    live_before = _ledger(RESTORED)
    assert live_before != restoring.ledger_at_t
    said = _restore(restoring, "--keep-replaced")
    assert _ledger(RESTORED) == restoring.ledger_at_t
    _reconcile_clean(RESTORED)
    (replaced,) = _schemas_like(f"{RESTORED}_replaced_")
    assert f"{replaced} (kept)" in said
    assert _ledger(replaced) == live_before  # what the operator compares with the restored tenant
    assert _ledger(OTHER) == restoring.other_after_t
    _drop(replaced)


def test_without_keep_replaced_the_live_schema_is_dropped_after_the_swap(restoring: World) -> None:
    said = _restore(restoring)
    assert "(dropped)" in said
    assert _schemas_like(f"{RESTORED}_") == []
    assert _ledger(RESTORED) == restoring.ledger_at_t


def test_a_dry_run_changes_nothing(restoring: World) -> None:
    _pay(RESTORED, restoring.payer, 555)
    before = _ledger(RESTORED)
    seen: list[tuple[str, int]] = []

    def spy(*, tenant: Tenant, **_: Any) -> StagedCheck:  # a second receiver: what the checks were given
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM wallets_ledgerentry")
            seen.append((str(connection.schema_name), int(cursor.fetchone()[0])))
        return StagedCheck()

    tenant_restore_staged.connect(spy, dispatch_uid="test-spy")
    try:
        said = _restore(restoring, "--dry-run")
    finally:
        tenant_restore_staged.disconnect(dispatch_uid="test-spy")
    assert "dry run" in said and "checked clean" in said and "nothing changed" in said
    ((checked_schema, entries),) = seen
    assert checked_schema.startswith(f"{RESTORED}_restoring_") and entries == restoring.ledger_at_t[0][1]  # the copy at T, staged
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []
    assert Tenant.objects.get(schema_name=RESTORED).is_active


def test_a_copy_whose_ledger_does_not_balance_is_refused_and_nothing_is_swapped(restoring: World) -> None:
    before = _ledger(RESTORED)
    with psycopg.connect(restoring.source, autocommit=True) as src:
        src.execute("SET session_replication_role = replica")  # planted: past any guard
        (row,) = src.execute(f"SELECT min(id) FROM {RESTORED}.wallets_balance WHERE balance > 0").fetchone()
        src.execute(f"UPDATE {RESTORED}.wallets_balance SET balance = balance + 1 WHERE id = %s", [row])
        try:
            with pytest.raises(CommandError, match=r"does not reconcile .*ledger_balance_mismatch"):
                _restore(restoring)
        finally:
            src.execute(f"UPDATE {RESTORED}.wallets_balance SET balance = balance - 1 WHERE id = %s", [row])
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []
    assert Tenant.objects.get(schema_name=RESTORED).is_active


def test_a_copy_nothing_checked_is_refused(restoring: World) -> None:
    before = _ledger(RESTORED)
    assert tenant_restore_staged.disconnect(dispatch_uid="reconciliation-restored-schema")
    try:
        with pytest.raises(CommandError, match="nothing checked the restored schema"):
            _restore(restoring)
    finally:
        tenant_restore_staged.connect(reconciliation_restored_schema_check, dispatch_uid="reconciliation-restored-schema")
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []


def test_a_source_whose_migrations_differ_is_refused(restoring: World) -> None:
    before = _ledger(RESTORED)
    with psycopg.connect(restoring.source, autocommit=True) as src:
        src.execute(f"INSERT INTO {RESTORED}.django_migrations (app, name, applied) VALUES ('payments', '9999_from_a_later_release', now())")
        try:
            with pytest.raises(CommandError, match=r"does not hold this code's migrations.*9999_from_a_later_release"):
                _restore(restoring)
        finally:
            src.execute(f"DELETE FROM {RESTORED}.django_migrations WHERE name = '9999_from_a_later_release'")
        last = src.execute(f"SELECT app, name FROM {RESTORED}.django_migrations ORDER BY id DESC LIMIT 1").fetchone()
        src.execute(f"DELETE FROM {RESTORED}.django_migrations WHERE app = %s AND name = %s", last)
        try:
            with pytest.raises(CommandError, match="missing 1"):
                _restore(restoring)
        finally:
            src.execute(f"INSERT INTO {RESTORED}.django_migrations (app, name, applied) VALUES (%s, %s, now())", last)
    connection.set_schema_to_public()
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []


def test_a_schema_that_is_no_tenant_is_refused(restoring: World) -> None:
    for schema, why in (("no_such_tenant", "no tenant with schema 'no_such_tenant'"), ("public", "'public' is not a tenant's schema"),
                        (str(settings.TENANT_BASE_SCHEMA), f"'{settings.TENANT_BASE_SCHEMA}' is not a tenant's schema")):
        with pytest.raises(CommandError, match=f"refused: {why}"):
            _restore(restoring, schema=schema)
    assert _schemas_like("no_such_tenant") == []


def _reader_holding(schema: str, *, seconds: float, started: threading.Event) -> threading.Thread:
    """A transaction of the tenant in flight: it has read a table (its lock held to the end)."""
    def body() -> None:
        with psycopg.connect(_dsn(str(connection.settings_dict["NAME"]))) as conn:
            conn.execute(f"SELECT count(*) FROM {schema}.wallets_balance")
            started.set()
            time.sleep(seconds)
            conn.commit()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert started.wait(10)
    return thread


def _restore_with_reader(world: World, *, holding: float, lock_timeout_ms: int, readers: list[threading.Thread]) -> TenantRestoreReport:
    """The service, with a transaction of the tenant started just before the swap."""
    def progress(line: str) -> None:
        if line.startswith("swapping"):
            readers.append(_reader_holding(RESTORED, seconds=holding, started=threading.Event()))

    try:
        return tenant_restore(schema_name=RESTORED, source=world.source, lock_timeout_ms=lock_timeout_ms, progress=progress)
    finally:
        connection.set_schema_to_public()


def test_the_swap_waits_for_the_tenants_transactions_in_flight_and_other_tenants_pay_meanwhile(restoring: World) -> None:
    # Busy past the lock timeout: refused, nothing swapped, the tenant switched on again.
    _pay(RESTORED, restoring.payer, 321)
    before = _ledger(RESTORED)
    readers: list[threading.Thread] = []
    with pytest.raises(TenantRestoreRefused, match="stayed busy past 500 ms"):
        _restore_with_reader(restoring, holding=3.0, lock_timeout_ms=500, readers=readers)
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []
    assert Tenant.objects.get(schema_name=RESTORED).is_active
    readers[0].join()

    # Busy for a moment: the swap waits for it; another tenant's payment does not wait for the swap.
    box: dict[str, Any] = {}

    def restore() -> None:
        try:
            box["report"] = _restore_with_reader(restoring, holding=3.0, lock_timeout_ms=10_000, readers=readers)
        finally:
            connections.close_all()

    swapping = threading.Thread(target=restore, daemon=True)
    swapping.start()
    deadline = time.monotonic() + 30
    while len(readers) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the swap now waits for the reader
    started = time.monotonic()
    _pay(OTHER, restoring.payer, 77)
    other_paid_in = time.monotonic() - started
    assert "report" not in box  # still waiting

    # A statement of the tenant arriving now queues behind the swap, then reads the restored table.
    queued: dict[str, Any] = {}

    def query() -> None:
        with psycopg.connect(_dsn(str(connection.settings_dict["NAME"])), autocommit=True) as conn:
            conn.execute(f"SET search_path = {RESTORED}, public")  # as django-tenants sets it
            row = conn.execute("SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t.id), '')) FROM wallets_balance t").fetchone()
            queued["balances"] = ("wallets_balance", *row) if row else None

    querying = threading.Thread(target=query, daemon=True)
    querying.start()
    querying.join(0.5)
    assert querying.is_alive()  # waiting behind the swap's lock
    swapping.join(30)
    readers[1].join()
    querying.join(10)
    assert queued["balances"] == restoring.ledger_at_t[1]
    assert box["report"].replaced_schema is not None, box
    assert other_paid_in < 1.0
    connection.set_schema_to_public()
    assert _ledger(RESTORED) == restoring.ledger_at_t
    restoring.other_after_t = _ledger(OTHER)
    _reconcile_clean(RESTORED)


def _restore_hooked(world: World, hooks: dict[str, Callable[[], None]], *, lock_timeout_ms: int = 10_000) -> TenantRestoreReport:
    """The service, `hooks[word]` run when its progress line starts with `word` (checking, swapping)."""
    def progress(line: str) -> None:
        for word, hook in hooks.items():
            if line.startswith(word):
                hook()

    try:
        return tenant_restore(schema_name=RESTORED, source=world.source, lock_timeout_ms=lock_timeout_ms, progress=progress)
    finally:
        connection.set_schema_to_public()


def _tables_in_oid_order(schema: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                       " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.oid", [schema])
        return [str(name) for (name,) in cursor.fetchall()]


def _transaction_of_the_tenant(statements: list[str], *, pause: float, box: dict[str, Any]) -> threading.Thread:
    """A transaction of the tenant: its first statement run (its lock held), then after `pause`
    the others, then its commit; `box["error"]` holds what failed."""
    started = threading.Event()

    def body() -> None:
        try:
            with psycopg.connect(_dsn(str(connection.settings_dict["NAME"]))) as conn:
                conn.execute(statements[0])
                started.set()
                time.sleep(pause)
                for statement in statements[1:]:
                    conn.execute(statement)
                conn.commit()
                box["committed"] = True
        except psycopg.Error as exc:
            box["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert started.wait(10)
    return thread


def test_a_payment_committing_its_due_work_during_the_swap_does_not_deadlock_with_it(restoring: World) -> None:
    # A payment's transaction holds its tables' locks; its commit adds a due-work row, whose
    # foreign key takes FOR KEY SHARE on the tenant's row while the swap waits for those tables.
    box: dict[str, Any] = {}
    threads: list[threading.Thread] = []
    due = (f"INSERT INTO public.tenants_duework (tenant_id, kind, due_at) VALUES ('{RESTORED}', 'relay', now())")
    hooks = {"swapping": lambda: threads.append(
        _transaction_of_the_tenant([f"SELECT count(*) FROM {RESTORED}.wallets_balance", due], pause=0.3, box=box))}
    report = _restore_hooked(restoring, hooks)
    threads[0].join(10)
    assert box.get("committed") and "error" not in box, box
    assert report.replaced_schema is not None
    assert _ledger(RESTORED) == restoring.ledger_at_t
    assert Tenant.objects.get(schema_name=RESTORED).is_active


def test_a_deadlock_with_the_tenants_transaction_is_a_refusal_and_the_tenant_is_switched_on_again(restoring: World) -> None:
    # The swap locks the tables in oid order: a transaction holding the last one, then reading
    # the first (the swap's by then), closes a cycle PostgreSQL breaks by cancelling the swap.
    before = _ledger(RESTORED)
    tables = _tables_in_oid_order(RESTORED)
    box: dict[str, Any] = {}
    threads: list[threading.Thread] = []
    hooks = {"swapping": lambda: threads.append(_transaction_of_the_tenant(
        [f"SELECT count(*) FROM {RESTORED}.{tables[-1]}", f"SELECT count(*) FROM {RESTORED}.{tables[0]}"], pause=0.3, box=box))}
    with pytest.raises(TenantRestoreRefused, match="deadlocked with the swap"):
        _restore_hooked(restoring, hooks)
    threads[0].join(10)
    assert box.get("committed"), box  # the tenant's transaction went on once the swap was cancelled
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []
    assert Tenant.objects.get(schema_name=RESTORED).is_active


def test_a_tenant_the_operator_switches_off_during_the_run_stays_off(restoring: World) -> None:
    def switch_off() -> None:
        Tenant.objects.filter(schema_name=RESTORED).update(is_active=False)

    try:
        _restore_hooked(restoring, {"checking": switch_off})
        assert not Tenant.objects.get(schema_name=RESTORED).is_active
        assert _ledger(RESTORED) == restoring.ledger_at_t
    finally:
        Tenant.objects.filter(schema_name=RESTORED).update(is_active=True)


def _run_that_died(*, switched_off: bool) -> str:
    """What a run killed between its switch-off and the swap leaves: a staging schema, marked
    if that run switched the tenant off, and then the tenant off."""
    from tenants.restore import _switch_off

    staging = f"{RESTORED}_restoring_20260101000000"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE SCHEMA "{staging}"')
    tenant = Tenant.objects.get(schema_name=RESTORED)
    if switched_off:
        _switch_off(tenant=tenant, staging=staging, lock_timeout_ms=1000)
    else:
        Tenant.objects.filter(pk=tenant.pk).update(is_active=False)  # the operator's
    return staging


@pytest.mark.parametrize("switched_off_by_the_run", [True, False])
def test_a_run_that_died_is_refused_again_until_cleanup_which_switches_on_only_what_it_switched_off(
    restoring: World, switched_off_by_the_run: bool
) -> None:
    staging = _run_that_died(switched_off=switched_off_by_the_run)
    try:
        assert not Tenant.objects.get(schema_name=RESTORED).is_active
        with pytest.raises(CommandError, match=f"left {staging}: run .*--cleanup"):
            _restore(restoring)
        out = io.StringIO()
        call_command("tenant_restore", "--schema", RESTORED, "--cleanup", "--source", restoring.source, stdout=out)
        assert f"staging dropped: {staging}" in out.getvalue()
        assert Tenant.objects.get(schema_name=RESTORED).is_active is switched_off_by_the_run
        assert _schemas_like(f"{RESTORED}_") == []
    finally:
        _drop(staging)
        Tenant.objects.filter(schema_name=RESTORED).update(is_active=True)


def test_a_second_run_of_the_same_tenant_is_refused(restoring: World) -> None:
    with psycopg.connect(_dsn(str(connection.settings_dict["NAME"])), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [0x72657374, RESTORED])
        with pytest.raises(CommandError, match=f"another tenant_restore of '{RESTORED}' is running"):
            _restore(restoring)


def test_credentials_revoked_after_the_instant_stay_revoked(restoring: World) -> None:
    from django.contrib.auth import get_user_model

    from wallets.services.principals import api_key_revoke

    with schema_context(RESTORED):
        api_key_revoke(api_key=ApiKey.objects.get(pk=restoring.keys["customer"]))
        user = get_user_model().objects.get(pk=restoring.keys["staff_user"])
        user.set_password("changed-after-the-instant")
        user.is_active = False
        user.save()
        password = user.password
    said = _restore(restoring)
    with schema_context(RESTORED):
        assert ApiKey.objects.get(pk=restoring.keys["customer"]).revoked_at is not None
        assert ApiKey.objects.get(pk=restoring.keys["staff"]).revoked_at is not None
        restored_user = get_user_model().objects.get(pk=restoring.keys["staff_user"])
        assert not restored_user.is_active and restored_user.password == password
    connection.set_schema_to_public()
    assert _ledger(RESTORED) == restoring.ledger_at_t
    assert "carried into the restored one: 2 API key(s) revoked, 1 login(s) deactivated, 1 password(s)" in said, said
    assert "webhook signing secrets are the instant's" in said


def test_replay_cache_entries_recorded_after_the_instant_are_dropped_and_other_tenants_kept(restoring: World) -> None:
    from idempotency.hotpath import CachedResponse, replay_cache_get, replay_cache_set

    entry = CachedResponse(fingerprint="f", status=201, headers={}, body=b"{}", request_id="r", replay_until=time.time() + 600)
    for schema in (RESTORED, OTHER):
        with schema_context(schema):
            replay_cache_set(principal_id="cus_x", key="k-after-t", entry=entry)
            assert replay_cache_get(principal_id="cus_x", key="k-after-t") == entry
    _restore(restoring)
    with schema_context(RESTORED):
        assert replay_cache_get(principal_id="cus_x", key="k-after-t") is None
    with schema_context(OTHER):
        assert replay_cache_get(principal_id="cus_x", key="k-after-t") == entry
    connection.set_schema_to_public()


def test_a_schema_name_too_long_for_the_longer_staging_name_is_refused(restoring: World) -> None:
    # 39 characters: `<name>_replaced_<14 digits>` is 63 and fits, `<name>_restoring_<14 digits>` is 64 and would be cut.
    with pytest.raises(CommandError, match="too long for a staging name"):
        _restore(restoring, schema="t" * 39)


def test_a_run_killed_while_its_swap_waits_leaves_the_tenant_off_and_cleanup_switches_it_on(restoring: World) -> None:
    """A real kill, not a planted leftover: the command runs as a process of its own; a
    transaction of the tenant holds a table, so its swap waits on `LOCK TABLE`; then SIGKILL.
    Nothing is swapped (the dead client's transaction rolls back), the tenant stays off with
    the run's marked staging schema left, a new run is refused, and `--cleanup` puts it right."""
    import os
    import signal
    import sys

    from tests.faults import ROOT, until
    from tests.test_failover import _test_database_url

    ledger_before = _ledger(RESTORED)
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", DATABASE_URL=_test_database_url(), REDIS_URL=str(settings.REDIS_URL),
               DJANGO_DEBUG="false", TALLY_LOG_LEVEL="WARNING")
    holder = psycopg.connect(_dsn(str(connection.settings_dict["NAME"])))
    holder.execute(f"SELECT count(*) FROM {RESTORED}.wallets_balance")  # held to the end of its transaction
    run = subprocess.Popen([sys.executable, "manage.py", "tenant_restore", "--schema", RESTORED, "--source", restoring.source,
                            "--lock-timeout-ms", "120000"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with psycopg.connect(_dsn("postgres"), autocommit=True) as watch:
            def swap_waiting() -> bool:
                return watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE%%'"
                                     " AND datname = %s", [connection.settings_dict["NAME"]]).fetchone() == (1,)
            until(swap_waiting, "the command's swap to wait for the tenant's table", seconds=120)
            run.send_signal(signal.SIGKILL)
            run.wait(10)
            holder.rollback()  # the swap's statement gets its lock, then finds its client gone
            until(lambda: not swap_waiting() and watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LOCK TABLE%%' AND state <> 'idle'").fetchone() == (0,),
                "the killed command's transaction to end", seconds=30)
    finally:
        holder.close()
        if run.poll() is None:
            run.kill()
    try:
        assert not Tenant.objects.get(schema_name=RESTORED).is_active
        assert _ledger(RESTORED) == ledger_before  # nothing swapped
        [staging] = _schemas_like(f"{RESTORED}_restoring_")
        with pytest.raises(CommandError, match=f"left {staging}: run .*--cleanup"):
            _restore(restoring)
        out = io.StringIO()
        call_command("tenant_restore", "--schema", RESTORED, "--cleanup", "--source", restoring.source, stdout=out)
        assert f"staging dropped: {staging}" in out.getvalue()
        assert Tenant.objects.get(schema_name=RESTORED).is_active
        assert _schemas_like(f"{RESTORED}_") == []
    finally:
        _drop(*_schemas_like(f"{RESTORED}_"))
        Tenant.objects.filter(schema_name=RESTORED).update(is_active=True)
