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
from collections.abc import Iterator
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
from tenants.models import Tenant
from tenants.restore import TenantRestoreRefused, TenantRestoreReport, tenant_restore
from tenants.services import tenant_create
from tests.factories import CustomerFactory, TerminalFactory, fund
from wallets.models import Customer, Terminal

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
            yield World(source=_dsn(source_name), ledger_at_t=ledger_at_t, other_after_t=_ledger(OTHER), payer=payer)
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
    said = _restore(restoring, "--dry-run")
    assert "dry run" in said and "nothing changed" in said
    assert _ledger(RESTORED) == before
    assert _schemas_like(f"{RESTORED}_") == []
    assert Tenant.objects.get(schema_name=RESTORED).is_active


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
    for schema in ("no_such_tenant", "public", str(settings.TENANT_BASE_SCHEMA)):
        with pytest.raises(CommandError, match="refused"):
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
