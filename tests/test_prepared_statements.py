"""Registered hot statements go as server-side prepared statements (tenants/postgresql_backend/prepared.py).

On real PostgreSQL: what the payment path prepares and runs prepared, that a prepared
statement reads the current tenant's schema, and that a statement PostgreSQL refuses to
prepare, a PREPARE in a transaction that rolls back, and a statement the server forgot
all leave the money path working.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.backends.postgresql.base import Cursor
from django.test.utils import CaptureQueriesContext

from payments.idempotency import services
from payments.services.charges import payment_create
from tenants.models import Tenant
from tenants.postgresql_backend.prepared import (
    PreparingCursor,
    prepared_statement_register,
    prepared_statements_of,
)
from tests.conftest import in_tenant
from tests.factories import CustomerFactory, TerminalFactory, fund
from wallets.models import Balance, Customer
from wallets.services.principals import api_key_create

pytestmark = pytest.mark.django_db


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

    before = (runs_of(services._CLAIM_SQL), runs_of(services._COMPLETE_SQL))
    for n in range(2):
        response = tenant_client.post(
            "/v1/terminal/payments", body, content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=f"prepared-{n}",
        )
        assert response.status_code == 201, response.content
        connection.set_tenant(tenant)
    assert (runs_of(services._CLAIM_SQL), runs_of(services._COMPLETE_SQL)) == (before[0] + 2, before[1] + 2)


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


def test_a_prepare_outlives_the_rollback_of_its_transaction(tenant: Tenant) -> None:
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


def test_registered_sql_takes_plain_placeholders_only() -> None:
    with pytest.raises(ValueError):
        prepared_statement_register("SELECT 1 WHERE 'a' LIKE '%%' AND %s")
    with pytest.raises(ValueError):
        prepared_statement_register("SELECT %(named)s")


def test_connections_prepare_unless_turned_off_or_binding_server_side(settings: Any) -> None:
    wrapper = connections["default"]
    assert wrapper.get_connection_params()["cursor_factory"] is PreparingCursor
    settings.TALLY_DB_PREPARED_STATEMENTS = False
    assert wrapper.get_connection_params()["cursor_factory"] is Cursor
