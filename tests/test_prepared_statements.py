"""Registered hot statements go as server-side prepared statements (fastpath/prepared.py).

On real PostgreSQL: what the payment path prepares and runs prepared, that a prepared
statement reads the current tenant's schema, and that a statement PostgreSQL refuses to
prepare, a PREPARE in a transaction that rolls back, and a statement the server forgot
all leave the money path working.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.db.backends.postgresql.base import Cursor, ServerBindingCursor
from django.test.utils import CaptureQueriesContext

from fastpath.prepared import (
    PreparingCursor,
    prepared_statement_name,
    prepared_statement_register,
    prepared_statements_of,
)
from idempotency import hotpath
from payments.services.charges import payment_create
from tenants.models import Tenant
from tests.conftest import in_tenant
from tests.factories import CustomerFactory, TerminalFactory, fund
from wallets.models import Balance, Customer
from wallets.services.principals import api_key_create


def _server_side() -> dict[str, tuple[str, int]]:
    """This session's prepared statements of ours: name -> (the SQL prepared, times run)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, statement, generic_plans + custom_plans FROM pg_prepared_statements WHERE name LIKE 'tally%%'"
        )
        # `statement` is the whole string sent: [SAVEPOINT;] PREPARE name (types) AS sql[; RELEASE]
        return {
            name: (sent.split(" AS ", 1)[1].split(";\nRELEASE SAVEPOINT")[0], runs) for name, sent, runs in cursor.fetchall()
        }


def _run(sql: str, params: list[Any]) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def _name_of(sql: str) -> str | None:
    execute = prepared_statements_of(connection.connection).get(sql)
    return execute.split()[1] if execute else None


def test_the_payment_paths_hot_statements_run_prepared_and_log_as_their_sql(tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    before = _server_side()
    with CaptureQueriesContext(connection) as logged:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    after = _server_side()
    ran = {name: statement for name, (statement, runs) in after.items() if runs > before.get(name, ("", 0))[1]}
    assert any('FOR UPDATE OF "wallets_balance"' in statement for statement in ran.values()), after
    assert any(statement.startswith('UPDATE "wallets_balance" SET "balance"') for statement in ran.values()), after
    # Django's query log shows the statements themselves, with their values.
    sql = [q["sql"] for q in logged.captured_queries]
    assert not any(one.startswith("EXECUTE") for one in sql), sql
    assert any(one.rstrip().endswith('FOR UPDATE OF "wallets_balance"') for one in sql), sql
    assert Balance.objects.filter(account__customer=customer, asset_id="JPY").get().balance == 10_000 - 200


def test_a_keyed_requests_claim_and_completion_run_prepared(tenant: Tenant, tenant_client: Any) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    key = api_key_create(principal=terminal)[1]
    body = {"customer": customer.pk, "asset": "JPY", "amount": 100}

    def runs_of(sql: str) -> int:
        wanted = _placeholders_erased(sql.replace("%s", "$"))
        return sum(count for text, count in _server_side().values() if _placeholders_erased(text) == wanted)

    claim_sql = hotpath.CLAIM_SQL
    complete_sql = hotpath.COMPLETION.sql_with_params(record_id=0, fence=0, status=0, headers="{}", body=b"", minted="{}", request_id="")[0]
    before = (runs_of(claim_sql), runs_of(complete_sql))
    for n in range(2):
        response = tenant_client.post(
            "/v1/terminal/payments", body, content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=f"prepared-{n}",
        )
        assert response.status_code == 201, response.content
        connection.set_tenant(tenant)
    assert (runs_of(claim_sql), runs_of(complete_sql)) == (before[0] + 2, before[1] + 2)


def _placeholders_erased(text: str) -> str:
    return re.sub(r"\$\d+", "$", text)


def test_a_prepared_statement_reads_the_current_tenants_schema(tenant: Tenant, tenant_b: Tenant) -> None:
    sql = prepared_statement_register("SELECT count(*) + %s FROM wallets_customer WHERE name LIKE %s")
    CustomerFactory(name="prepared-probe one")
    in_a = _run(sql, [0, "prepared-probe%"])
    with in_tenant(tenant_b):
        CustomerFactory(name="prepared-probe two")
        CustomerFactory(name="prepared-probe three")
        in_b = _run(sql, [0, "prepared-probe%"])
        assert in_b == Customer.objects.filter(name__startswith="prepared-probe").count() == 2
    assert (in_a, _run(sql, [0, "prepared-probe%"])) == (1, 1)
    name = _name_of(sql)
    assert name is not None and _server_side()[name][1] == 3  # one statement, run in both schemas


def test_a_statement_postgresql_refuses_to_prepare_goes_as_it_is_and_the_transaction_carries_on(tenant: Tenant) -> None:
    # `%s IS NULL` with a NULL: PostgreSQL cannot infer the parameter's type, so PREPARE fails.
    sql = prepared_statement_register("SELECT %s IS NULL")
    with transaction.atomic():
        customer = CustomerFactory(name="written before the refused prepare")
        assert _run(sql, [None]) is True
        Customer.objects.filter(pk=customer.pk).update(name="written after it")
    assert prepared_statements_of(connection.connection)[sql] is None
    assert Customer.objects.get(pk=customer.pk).name == "written after it"
    assert _run(sql, [None]) is True  # and keeps going as it is


def test_a_prepare_outlives_the_rollback_of_its_transaction(live_tenant: Tenant) -> None:
    sql = prepared_statement_register("SELECT %s + 1")

    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():
        assert _run(sql, [41]) == 42
        raise Undone
    name = _name_of(sql)
    assert name is not None and name in _server_side()
    assert _run(sql, [1]) == 2 and _server_side()[name][1] == 2


def test_a_statement_the_server_forgot_fails_once_then_is_prepared_again(tenant: Tenant) -> None:
    sql = prepared_statement_register("SELECT %s * 2")
    assert _run(sql, [21]) == 42
    with connection.connection.cursor() as raw:
        raw.execute("DEALLOCATE ALL")
    with pytest.raises(DatabaseError), transaction.atomic():
        _run(sql, [1])
    assert prepared_statements_of(connection.connection) == {}
    assert _run(sql, [2]) == 4
    assert _name_of(sql) in _server_side()


def test_a_migration_that_changes_a_returned_columns_type_fails_once_then_is_prepared_again(tenant: Tenant) -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE prepared_probe (a bigint, b bigint)")
        cursor.execute("INSERT INTO prepared_probe VALUES (1, 7)")
    sql = prepared_statement_register("SELECT b FROM prepared_probe WHERE a = %s")
    assert _run(sql, [1]) == 7
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE prepared_probe ALTER COLUMN b TYPE text")
    with pytest.raises(DatabaseError, match="result type"), transaction.atomic():
        _run(sql, [1])
    assert _run(sql, [1]) == "7"


def test_a_migration_that_changes_a_compared_columns_type_fails_once_then_is_prepared_again(tenant: Tenant) -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE prepared_probe_compared (a text, b bigint)")
        cursor.execute("INSERT INTO prepared_probe_compared VALUES ('1', 7)")
    sql = prepared_statement_register("SELECT b FROM prepared_probe_compared WHERE a = %s")
    assert _run(sql, ["1"]) == 7  # $1 prepared as text, from the column
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE prepared_probe_compared ALTER COLUMN a TYPE integer USING a::integer")
    with pytest.raises(DatabaseError, match="operator does not exist"), transaction.atomic():
        _run(sql, ["1"])
    assert _run(sql, ["1"]) == 7 and _run(sql, ["1"]) == 7


def test_a_value_of_another_type_is_another_statement_never_rounded(tenant: Tenant) -> None:
    sql = prepared_statement_register("SELECT %s::numeric * 2")
    assert _run(sql, [2]) == 4  # prepared with $1 bigint
    assert _run(sql, [Decimal("2.5")]) == Decimal("5.0")  # not 2.5 rounded into that bigint
    ours = [name for name, (text, _) in _server_side().items() if text.startswith("SELECT $1::numeric * 2")]
    assert sorted(ours) == sorted([prepared_statement_name(sql, (True,)), prepared_statement_name(sql, (False,))])


def test_a_name_is_the_statement_itself_on_every_session(tenant: Tenant) -> None:
    """A name is a hash of the SQL and its types: another process (or a pooler's earlier
    client) that prepared the same name prepared the same statement, so it is used as is,
    and two statements never share a name."""
    sql = prepared_statement_register("SELECT %s + 100")
    name = prepared_statement_name(sql, (True,))
    assert name != prepared_statement_name("SELECT %s + 101", (True,)) != prepared_statement_name(sql, (False,))
    with connection.connection.cursor() as raw:
        raw.execute(f"PREPARE {name} (bigint) AS SELECT $1 + 100")
    assert _run(sql, [1]) == 101
    assert prepared_statements_of(connection.connection)[sql] == f"EXECUTE {name} (%s)"


def test_a_transaction_that_begins_with_a_refused_prepare_carries_on(live_tenant: Tenant) -> None:
    """psycopg begins a transaction at its first statement: a PREPARE that is that first
    statement still runs in its own savepoint."""
    sql = prepared_statement_register("SELECT %s IS NULL AND true")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the tenant's search_path is set now, outside the transaction
    with transaction.atomic():
        assert _run(sql, [None]) is True  # the transaction's first statement
        assert Customer.objects.filter(pk="cus_none").count() == 0  # and it goes on
    assert prepared_statements_of(connection.connection)[sql] is None


def test_a_prepare_that_times_out_raises_as_the_statement_would_and_is_tried_again(live_tenant: Tenant) -> None:
    """A PREPARE waits for the locks of the tables it names. A timeout there is the
    statement's own failure (not cached as 'will not prepare'); once the lock is gone the
    statement prepares."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as holder:
        holder.execute("CREATE TABLE IF NOT EXISTS public.prepared_lock_probe (a int)")
        try:
            sql = prepared_statement_register("SELECT count(*) + %s FROM public.prepared_lock_probe")
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE public.prepared_lock_probe IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(OperationalError, match="lock timeout"), transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '100ms'")
                _run(sql, [1])
            assert sql not in prepared_statements_of(connection.connection)
            holder.execute("ROLLBACK")
            with transaction.atomic():
                assert _run(sql, [1]) == 1
            assert prepared_statements_of(connection.connection)[sql] is not None
        finally:
            holder.execute("ROLLBACK") if holder.info.transaction_status != psycopg.pq.TransactionStatus.IDLE else None
            holder.execute("DROP TABLE IF EXISTS public.prepared_lock_probe")


def test_registered_sql_takes_plain_placeholders_only() -> None:
    with pytest.raises(ValueError):
        prepared_statement_register("SELECT 1 WHERE 'a' LIKE '%%' AND %s")
    with pytest.raises(ValueError):
        prepared_statement_register("SELECT %(named)s")


def test_connections_prepare_unless_turned_off_or_binding_server_side(settings: Any) -> None:
    wrapper = connections["default"]
    assert wrapper.get_connection_params()["cursor_factory"] is PreparingCursor
    saved = wrapper.settings_dict
    wrapper.settings_dict = {**saved, "OPTIONS": {**saved["OPTIONS"], "server_side_binding": True}}
    try:
        assert wrapper.get_connection_params()["cursor_factory"] is ServerBindingCursor  # psycopg prepares by itself
    finally:
        wrapper.settings_dict = saved
    settings.TALLY_DB_PREPARED_STATEMENTS = False
    assert wrapper.get_connection_params()["cursor_factory"] is Cursor
