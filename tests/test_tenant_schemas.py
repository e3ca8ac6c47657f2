"""A tenant schema cloned from the template (tenants.schemas) is the schema that running
every migration makes: same tables, columns, defaults, constraints, indexes, triggers,
functions, sequences (owned by the same columns, at the same positions) and seeded rows.
The comparison is shown to catch a difference of each kind it is trusted with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction

from tenants.models import Tenant
from tenants.schemas import SchemaCloneRefused, migrations_on_disk, schema_clone, schemas_missing_migrations
from tests.pooler import behind_a_pooler, server_pid
from tests.tools.schema_shape import one_migration_back, schema_shape, shape_differences

TEMPLATE = settings.TENANT_BASE_SCHEMA


def _drop(*schemas: str) -> None:
    connection.set_schema_to_public()
    with connection.cursor() as cursor:
        for schema in schemas:
            cursor.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _sql(schema: str, sql: str) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'SET LOCAL search_path = "{schema}"')
        cursor.execute(sql)
    connection.search_path_set_schemas = None


@pytest.fixture(scope="module")
def migrated_shape(django_db_setup: None, django_db_blocker: Any) -> Iterator[dict[str, set[tuple[Any, ...]]]]:
    """A schema made by running every tenant migration, as django-tenants does without a
    template (post_migrate seeds its content types and permissions)."""
    with django_db_blocker.unblock():
        _drop("shape_migrated")
        with connection.cursor() as cursor:
            cursor.execute('CREATE SCHEMA "shape_migrated"')
        call_command("migrate_schemas", tenant=True, schema_name="shape_migrated", interactive=False, verbosity=0)
        connection.set_schema_to_public()
        yield schema_shape("shape_migrated")
        _drop("shape_migrated")


@pytest.fixture
def clone(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    with django_db_blocker.unblock():
        _drop("shape_clone")
        schema_clone(source=TEMPLATE, target="shape_clone")
        yield "shape_clone"
        _drop("shape_clone")


def test_a_cloned_schema_equals_a_migrated_one(migrated_shape: dict[str, set[tuple[Any, ...]]], clone: str,
                                               django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():
        cloned = schema_shape(clone)
    assert shape_differences(migrated_shape, cloned) == []
    # The comparison is not vacuous: it saw every kind of object the migrations make.
    for kind in ("relations", "columns", "constraints", "indexes", "triggers", "sequences", "routines",
                 "rows:django_migrations", "rows:django_content_type", "rows:auth_permission"):
        assert cloned[kind], kind
    assert {row[2] for row in cloned["constraints"]} >= {"p", "u", "c", "f"}
    assert any(row[4] is not None for row in cloned["columns"] if row[5] == "d")  # identity defaults seen


MUTATIONS: dict[str, tuple[str, str]] = {
    # what is changed in the clone -> (SQL, the kind the comparison must report)
    "an index dropped": ("DROP INDEX payment_created", "indexes"),
    "a trigger dropped": ("DROP TRIGGER ledgerentry_append_only ON wallets_ledgerentry", "triggers"),
    "a trigger pointing at the template's function": (
        f"DROP TRIGGER ledgerentry_append_only ON wallets_ledgerentry; CREATE TRIGGER ledgerentry_append_only"
        f" BEFORE UPDATE OR DELETE ON wallets_ledgerentry FOR EACH ROW EXECUTE FUNCTION {TEMPLATE}.tally_ledger_append_only()",
        "triggers",
    ),
    "a CHECK constraint dropped": ("ALTER TABLE wallets_balance DROP CONSTRAINT IF EXISTS {check}", "constraints"),
    "a foreign key dropped": ("ALTER TABLE auth_permission DROP CONSTRAINT {fk}", "constraints"),
    "a column default changed": ("ALTER TABLE wallets_customer ALTER COLUMN phone SET DEFAULT 'x'", "columns"),
    "a NOT NULL dropped": ("ALTER TABLE django_content_type ALTER COLUMN model DROP NOT NULL", "columns"),
    "a sequence left behind": ("SELECT setval('django_content_type_id_seq', 1, false)", "sequence_positions"),
    "a django_migrations row missing": ("DELETE FROM django_migrations WHERE name = '0001_initial' AND app = 'webhooks'",
                                        "rows:django_migrations"),
}


def _named(kind: str, schema: str, table: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT con.conname FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND con.contype = %s"
            " ORDER BY con.conname LIMIT 1",
            [schema, table, kind],
        )
        return str(cursor.fetchone()[0])


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_comparison_reports_each_kind_of_difference(migrated_shape: dict[str, set[tuple[Any, ...]]], clone: str,
                                                        mutation: str, django_db_blocker: Any) -> None:
    sql, kind = MUTATIONS[mutation]
    with django_db_blocker.unblock():
        sql = sql.format(check=_named("c", clone, "wallets_balance") if "{check}" in sql else "",
                         fk=_named("f", clone, "auth_permission") if "{fk}" in sql else "")
        _sql(clone, sql)
        differences = shape_differences(migrated_shape, schema_shape(clone))
    assert differences, mutation
    assert any(line.startswith(f"{kind}: ") for line in differences), differences


def test_a_cloned_schema_uses_its_own_sequences_and_functions(clone: str, django_db_blocker: Any) -> None:
    """The clone's rows take ids after the template's, from its own sequence."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT last_value FROM {TEMPLATE}.django_content_type_id_seq")
            (before,) = cursor.fetchone()
        _sql(clone, "INSERT INTO django_content_type (app_label, model) VALUES ('shape', 'probe')")
        with connection.cursor() as cursor:
            cursor.execute("SELECT max(id) FROM shape_clone.django_content_type")
            (newest,) = cursor.fetchone()
            cursor.execute(f"SELECT last_value FROM {TEMPLATE}.django_content_type_id_seq")
            (after,) = cursor.fetchone()
        assert newest == before + 1 and after == before
    connection.set_schema_to_public()


def test_the_clone_refuses_a_template_holding_an_unknown_kind_of_object(django_db_setup: None, django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():
        _drop("shape_odd", "shape_odd_clone")
        with connection.cursor() as cursor:
            cursor.execute("CREATE SCHEMA shape_odd; CREATE TABLE shape_odd.t (id int); CREATE VIEW shape_odd.v AS SELECT id FROM shape_odd.t")
        try:
            with pytest.raises(SchemaCloneRefused, match="v"):
                schema_clone(source="shape_odd", target="shape_odd_clone")
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'shape_odd_clone'")
                assert cursor.fetchone()[0] == 0
        finally:
            _drop("shape_odd", "shape_odd_clone")


@pytest.mark.parametrize("function", [
    # Guards, as the template's own functions are: a trigger function that reads a table.
    "CREATE FUNCTION shape_odd.f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN PERFORM 1 FROM shape_odd.t; RETURN NEW; END'",
    "CREATE FUNCTION shape_odd.f() RETURNS trigger LANGUAGE plpgsql SET search_path = shape_odd AS 'BEGIN PERFORM 1 FROM t; RETURN NEW; END'",
])
def test_the_clone_refuses_a_function_that_names_the_template(function: str, django_db_setup: None, django_db_blocker: Any) -> None:
    """A function's body and settings are copied as written: naming the template there
    would point every tenant's copy at the template's tables."""
    with django_db_blocker.unblock():
        _drop("shape_odd", "shape_odd_clone")
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA shape_odd; CREATE TABLE shape_odd.t (id int); {function}")
        try:
            with pytest.raises(SchemaCloneRefused, match="names the template schema 'shape_odd'"):
                schema_clone(source="shape_odd", target="shape_odd_clone")
        finally:
            _drop("shape_odd", "shape_odd_clone")


def test_tenant_creation_migrates_a_template_behind_the_code_before_cloning_it(
    django_db_setup: None, django_db_blocker: Any
) -> None:
    """A template that misses a migration must not have it faked into the new tenant
    (django-tenants' clone path records every migration as applied after cloning)."""
    from tenants.services import tenant_create

    with django_db_blocker.unblock():
        _drop("shape_tenant")
        connection.set_schema_to_public()
        Tenant.objects.filter(schema_name="shape_tenant").delete()
        call_command("migrate_schemas", "webhooks", one_migration_back("webhooks"), tenant=True, schema_name=TEMPLATE,
                     interactive=False, verbosity=0)
        assert schemas_missing_migrations(schemas=[TEMPLATE]) == {TEMPLATE: 1}
        try:
            with pytest.raises(SchemaCloneRefused, match="misses 1 "):
                Tenant(schema_name="shape_tenant", name="Shape", main_currency="JPY").save(verbosity=0)
            assert not Tenant.objects.filter(schema_name="shape_tenant").exists()
            assert schemas_missing_migrations(schemas=["shape_tenant"]) == {"shape_tenant": len(migrations_on_disk())}  # no schema left
            tenant = tenant_create(schema_name="shape_tenant", domain="shape.test.localhost", name="Shape", main_currency="JPY")
            assert schemas_missing_migrations(schemas=["shape_tenant"]) == {"shape_tenant": 0}
            assert tenant.schema_name == "shape_tenant"
        finally:
            call_command("migrate_schemas", tenant=True, schema_name=TEMPLATE, interactive=False, verbosity=0)
            connection.set_schema_to_public()
            Tenant.objects.filter(schema_name="shape_tenant").delete()
            _drop("shape_tenant")
        assert schemas_missing_migrations(schemas=[TEMPLATE]) == {TEMPLATE: 0}



def test_a_tenant_is_cloned_on_a_new_session_unless_a_transaction_holds_the_old_one(
    django_db_setup: None, django_db_blocker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each invalidation the clone's DDL sends walks every plan the session has saved; a
    session that has served many tenants holds thousands. A plan the caller prepared must
    not be in the session that clones; inside the caller's transaction, the session (and
    the transaction) is kept."""
    from tenants import models
    from tenants.services import tenant_create

    seen: list[tuple[int, int]] = []
    real_clone = models.schema_clone

    def observed_clone(*, source: str, target: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements WHERE name = 'tally_probe'")
            seen.append(cursor.fetchone())
        real_clone(source=source, target=target)

    monkeypatch.setattr(models, "schema_clone", observed_clone)
    with django_db_blocker.unblock():
        if behind_a_pooler():
            pytest.skip("a new client session: behind a pooler the server session may be the same one")
        _drop("shape_session_a", "shape_session_b")
        try:
            with connection.cursor() as cursor:
                cursor.execute("PREPARE tally_probe AS SELECT 1")
            caller = server_pid()
            tenant_create(schema_name="shape_session_a", domain="shape-a.test.localhost", name="A", main_currency="JPY")
            assert seen[-1][0] != caller and seen[-1][1] == 0

            with connection.cursor() as cursor:
                cursor.execute("PREPARE tally_probe AS SELECT 1")
            with transaction.atomic():
                caller = server_pid()
                tenant_create(schema_name="shape_session_b", domain="shape-b.test.localhost", name="B", main_currency="JPY")
                assert seen[-1] == (caller, 1)
                assert server_pid() == caller
        finally:
            connection.set_schema_to_public()
            Tenant.objects.filter(schema_name__in=["shape_session_a", "shape_session_b"]).delete()
            _drop("shape_session_a", "shape_session_b")
            connection.close()  # the probe statement goes with the session


def test_the_template_is_read_once_per_migration_state(django_db_setup: None, django_db_blocker: Any) -> None:
    """The catalog read grows with the tenant count; clones reuse it until a migration
    row of the template changes."""
    from tenants import schemas

    captured: list[str] = []
    real_capture = schemas.schema_script_capture

    def counting_capture(*, source: str) -> schemas.SchemaScript:
        captured.append(source)
        return real_capture(source=source)

    with django_db_blocker.unblock():
        _drop("shape_once_a", "shape_once_b", "shape_once_c")
        schemas._script_cache.clear()
        schemas.schema_script_capture = counting_capture  # type: ignore[assignment]
        try:
            schema_clone(source=TEMPLATE, target="shape_once_a")
            schema_clone(source=TEMPLATE, target="shape_once_b")
            assert captured == [TEMPLATE]
            with connection.cursor() as cursor:  # as a migration run on the template would
                cursor.execute(f"INSERT INTO {TEMPLATE}.django_migrations (app, name, applied) VALUES ('shape', 'probe', now())")
            try:
                schema_clone(source=TEMPLATE, target="shape_once_c")
                assert captured == [TEMPLATE, TEMPLATE]
            finally:
                with connection.cursor() as cursor:
                    cursor.execute(f"DELETE FROM {TEMPLATE}.django_migrations WHERE app = 'shape'")
        finally:
            schemas.schema_script_capture = real_capture  # type: ignore[assignment]
            schemas._script_cache.clear()
            _drop("shape_once_a", "shape_once_b", "shape_once_c")
    connection.set_schema_to_public()


# What an empty tenant costs, by kind (tables, indexes, sequences; TOAST apart), as built
# today: a new index, table or sequence must fit under it or raise it on purpose, with the
# query plan that needs it (docs/SCALING.md, "Ten thousand tenants on one database").
EMPTY_TENANT_RELATIONS = {"r": 50, "i": 163, "S": 22}


def test_an_empty_tenant_costs_what_its_budget_says_and_has_no_pattern_ops_index(django_db_setup: None, django_db_blocker: Any) -> None:
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT relkind, count(*) FROM pg_class WHERE relnamespace = %s::regnamespace GROUP BY relkind", [TEMPLATE])
        relations = dict(cursor.fetchall())
        cursor.execute(
            """
            SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
              JOIN pg_opclass o ON o.oid = ANY (x.indclass::oid[])
             WHERE i.relnamespace = %s::regnamespace AND o.opcname IN ('varchar_pattern_ops', 'text_pattern_ops')
            """,
            [TEMPLATE],
        )
        pattern_ops = [name for (name,) in cursor.fetchall()]
    assert pattern_ops == []
    over = {kind: count for kind, count in relations.items() if count > EMPTY_TENANT_RELATIONS.get(kind, 0)}
    assert over == {}, f"{relations} against the budget {EMPTY_TENANT_RELATIONS}"
