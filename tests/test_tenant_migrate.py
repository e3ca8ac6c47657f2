"""`migrate_schemas` over every tenant visits only the tenants with a migration to run
(tenants/management/commands/migrate_schemas.py), found by one query over all schemas;
the tenant it migrates ends up as a tenant that never fell behind."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django_tenants.migration_executors import standard

from tenants.models import Tenant
from tenants.schemas import migrations_on_disk, schemas_missing_migrations
from tenants.services import tenant_create
from tests.tools.schema_shape import one_migration_back, schema_shape, shape_differences

BEHIND, AHEAD = "mig_behind", "mig_ahead"


def _remove(*schemas: str) -> None:
    connection.set_schema_to_public()
    Tenant.objects.filter(schema_name__in=schemas).delete()
    with connection.cursor() as cursor:
        for schema in schemas:
            cursor.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def two_tenants(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        _remove(BEHIND, AHEAD)
        for schema in (BEHIND, AHEAD):
            tenant_create(schema_name=schema, domain=f"{schema}.test.localhost", name=schema, main_currency="JPY")
        try:
            yield
        finally:
            _remove(BEHIND, AHEAD)


def test_only_a_tenant_behind_is_migrated_and_it_ends_as_one_that_never_was(
    two_tenants: None, django_db_blocker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with django_db_blocker.unblock():
        call_command("migrate_schemas", "webhooks", one_migration_back("webhooks"), schema_name=BEHIND, interactive=False, verbosity=0)
        connection.set_schema_to_public()
        schemas = [str(s) for s in Tenant.objects.exclude(schema_name="public").values_list("schema_name", flat=True)]
        assert len(schemas) >= 4  # the template, the session's tenants and these two
        assert schemas_missing_migrations(schemas=schemas) == {s: int(s == BEHIND) for s in schemas}

        visited: list[str] = []
        real = standard.run_migrations

        def recording(*args: Any, **kwargs: Any) -> Any:
            visited.append(args[3] if len(args) > 3 else kwargs["schema_name"])
            return real(*args, **kwargs)

        monkeypatch.setattr(standard, "run_migrations", recording)
        out = io.StringIO()
        call_command("migrate_schemas", tenant=True, interactive=False, verbosity=1, stdout=out)
        assert visited == [BEHIND]
        assert f"1 of {len(schemas)} tenants to migrate" in out.getvalue()
        connection.set_schema_to_public()
        assert schemas_missing_migrations(schemas=schemas) == dict.fromkeys(schemas, 0)
        differences = shape_differences(schema_shape(AHEAD), schema_shape(BEHIND))
        # Going back and forth wrote one django_migrations row twice: its id moved on.
        assert [d for d in differences if "'django_migrations_id_seq'" not in d] == []

        visited.clear()
        call_command("migrate_schemas", tenant=True, all_tenants=True, interactive=False, verbosity=0)
        assert sorted(visited) == sorted(schemas)  # --all-tenants: django-tenants' own visit of every tenant
        connection.set_schema_to_public()


def test_a_schema_without_django_migrations_counts_every_migration_missing(django_db_setup: None, django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():
        _remove("mig_empty")
        with connection.cursor() as cursor:
            cursor.execute('CREATE SCHEMA "mig_empty"')
        try:
            assert schemas_missing_migrations(schemas=["mig_empty"]) == {"mig_empty": len(migrations_on_disk())}
        finally:
            _remove("mig_empty")


def test_a_tenant_missing_an_earlier_migration_is_behind_even_with_every_last_one(
    django_db_setup: None, django_db_blocker: Any, tenant_a: Tenant
) -> None:
    """Holding each app's last migration is not enough (a --fake, a migration merged into
    history): a missing earlier one could be a guard the tenant never got."""
    from django.db.migrations.loader import MigrationLoader

    leaves = set(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    app, name = sorted(migrations_on_disk() - leaves)[0]
    schema = tenant_a.schema_name
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        assert schemas_missing_migrations(schemas=[schema]) == {schema: 0}
        with connection.cursor() as cursor:
            cursor.execute(f'SELECT applied FROM "{schema}".django_migrations WHERE app = %s AND name = %s', [app, name])
            (applied,) = cursor.fetchone()
            cursor.execute(f'DELETE FROM "{schema}".django_migrations WHERE app = %s AND name = %s', [app, name])
        try:
            assert schemas_missing_migrations(schemas=[schema]) == {schema: 1}
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f'INSERT INTO "{schema}".django_migrations (app, name, applied) VALUES (%s, %s, %s)', [app, name, applied])


def test_the_table_list_read_by_index_equals_djangos_in_every_kind_of_schema(
    django_db_setup: None, django_db_blocker: Any, tenant_a: Tenant
) -> None:
    """fastpath.backend reads a tenant's table list through pg_depend (Django scans every
    relation of the database); the answer must be Django's, table for table."""
    from django.conf import settings
    from django_tenants.postgresql_backend.introspection import DatabaseSchemaIntrospection
    from django_tenants.utils import schema_context

    djangos = DatabaseSchemaIntrospection(connection)
    with django_db_blocker.unblock():
        for schema in (tenant_a.schema_name, str(settings.TENANT_BASE_SCHEMA), "public"):
            with schema_context(schema), connection.cursor() as cursor:
                ours = sorted(connection.introspection.get_table_list(cursor))
                assert ours == sorted(djangos.get_table_list(cursor)), schema
                assert "django_migrations" in {t.name for t in ours}
                if schema != "public":  # tenant tables only: public's are not on its path
                    assert "wallets_balance" in {t.name for t in ours} and "tenants_tenant" not in {t.name for t in ours}
        connection.set_schema_to_public()


def _bare_schemas(count: int, *, like: str) -> list[str]:
    """`count` schemas holding only a django_migrations table: the first holds every row of
    `like`'s, each next one a row fewer (schema i misses i migrations)."""
    names = [f"mig_bare_{i}" for i in range(count)]
    with connection.cursor() as cursor:
        for i, name in enumerate(names):
            cursor.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE; CREATE SCHEMA "{name}"')
            cursor.execute(f'CREATE TABLE "{name}".django_migrations (LIKE "{like}".django_migrations INCLUDING ALL)')
            cursor.execute(
                f'INSERT INTO "{name}".django_migrations SELECT * FROM "{like}".django_migrations ORDER BY id OFFSET %s', [i]
            )
    return names


def test_the_schemas_behind_are_counted_in_batches(tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 7 schemas (the real size is larger): each schema's count is its own, across batches."""
    import tenants.schemas as schemas_module

    monkeypatch.setattr(schemas_module, "MISSING_MIGRATIONS_BATCH", 7)
    connection.set_schema_to_public()
    names = _bare_schemas(30, like=tenant.schema_name)
    try:
        assert schemas_missing_migrations(schemas=[tenant.schema_name, *names, "mig_no_such_schema"]) == {
            tenant.schema_name: 0, **{name: i for i, name in enumerate(names)}, "mig_no_such_schema": len(migrations_on_disk()),
        }
    finally:
        with connection.cursor() as cursor:
            cursor.execute("".join(f'DROP SCHEMA IF EXISTS "{name}" CASCADE;' for name in names))


def test_twelve_thousand_schemas_are_checked_without_one_statement_over_them_all(tenant: Tenant) -> None:
    """One UNION ALL over every schema's django_migrations could not be parsed past about
    10,000 branches (`stack depth limit exceeded`), and no deploy could migrate. The count
    of branches is what matters, not distinct tables: the same schema 12,000 times crosses it."""
    connection.set_schema_to_public()
    assert schemas_missing_migrations(schemas=[tenant.schema_name] * 12_000) == {tenant.schema_name: 0}
