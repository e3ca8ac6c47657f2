"""The database ENGINE ("fastpath.backend"): django-tenants' PostgreSQL backend, with
prepared hot statements (fastpath.prepared) and the changes each class below states."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.postgresql.base import Cursor
from django.db.backends.postgresql.creation import DatabaseCreation
from django.db.backends.postgresql.introspection import TableInfo
from django.db.backends.postgresql.operations import DatabaseOperations
from django.db.backends.postgresql.schema import DatabaseSchemaEditor
from django_tenants.postgresql_backend.base import DatabaseWrapper as TenantsDatabaseWrapper
from django_tenants.postgresql_backend.introspection import DatabaseSchemaIntrospection, DatabaseSchemaIntrospectionSearchPathContext
from django_tenants.utils import get_public_schema_name
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from fastpath.prepared import PreparingCursor, prepared_query_logged


class Operations(DatabaseOperations):
    def last_executed_query(self, cursor: Any, sql: Any, params: Any) -> str | None:  # type: ignore[override]  # Django's own returns None when it has no query to show; its stub says str
        # The query log shows a prepared statement's SQL with its values, as unprepared.
        logged = prepared_query_logged(cursor, sql, params)
        return logged if logged is not None else super().last_executed_query(cursor, sql, params)


class Creation(DatabaseCreation):
    """The test database is dropped WITH (FORCE): behind a pooler in session mode
    (PgBouncer, devtools/pgbouncer.py) the pooler keeps idle server sessions on it after the
    suite's clients have gone, and a plain DROP DATABASE is refused while any session is on
    it, at the end of the run and at the start of the next one."""

    def _execute_create_test_db(self, cursor: Any, parameters: dict[str, Any], keepdb: bool = False) -> None:
        try:
            super()._execute_create_test_db(cursor, parameters, keepdb)  # type: ignore[misc]  # Django's, private: not in its stubs
        except Exception as failure:
            if keepdb or not isinstance(failure.__cause__, pg_errors.DuplicateDatabase):
                raise
            # Left by an earlier run: dropped, as Django's non-interactive run drops it.
            cursor.execute(f"DROP DATABASE {parameters['dbname']} WITH (FORCE)")
            super()._execute_create_test_db(cursor, parameters, keepdb)  # type: ignore[misc]  # as above

    def _destroy_test_db(self, test_database_name: str, verbosity: int) -> None:
        self.connection.close_pool()
        with self._nodb_cursor() as cursor:  # type: ignore[attr-defined]  # Django's, private: not in its stubs
            cursor.execute(f"DROP DATABASE {self.connection.ops.quote_name(test_database_name)} WITH (FORCE)")


class SchemaEditor(DatabaseSchemaEditor):
    """No `varchar_pattern_ops` twin beside the index of an indexed or unique text column.
    It serves only `LIKE 'prefix%'` outside the C collation, and no query here runs one on
    such a column (ids, key hashes, references; the admin's searches are exact or
    `icontains`, which no btree serves). wallets' migration 0021 dropped those built before."""

    def _create_like_index_sql(self, model: Any, field: Any) -> None:
        return None


class Introspection(DatabaseSchemaIntrospection):  # type: ignore[misc]  # django-tenants is untyped
    """Django's table list scans every relation of the database (pg_class has no index by
    schema) and django-tenants' migrate asks for it several times a tenant (through
    MigrationRecorder's has_table): 210 ms a call at 1,000 tenants, most of a no-op tenant
    migration. In a tenant's schema the same list is read through the schema's entries in
    pg_depend, which are indexed by the object depended on: 1 ms. The public schema is
    pinned (PostgreSQL records no dependency on it), so it keeps Django's query."""

    def get_table_list(self, cursor: Any) -> list[TableInfo]:
        if self.connection.schema_name == get_public_schema_name():
            return list(super().get_table_list(cursor))
        with DatabaseSchemaIntrospectionSearchPathContext(cursor=cursor, connection=self.connection):
            cursor.execute(
                """
                SELECT c.relname, CASE WHEN c.relispartition THEN 'p' WHEN c.relkind IN ('m', 'v') THEN 'v' ELSE 't' END,
                       obj_description(c.oid, 'pg_class')
                  FROM pg_catalog.pg_namespace n
                  JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_namespace'::regclass AND d.refobjid = n.oid
                       AND d.classid = 'pg_catalog.pg_class'::regclass
                  JOIN pg_catalog.pg_class c ON c.oid = d.objid
                 WHERE n.nspname = ANY(current_schemas(false)) AND c.relkind IN ('f', 'm', 'p', 'r', 'v')
                   AND pg_catalog.pg_table_is_visible(c.oid)
                """
            )
            return [TableInfo(*row) for row in cursor.fetchall() if row[0] not in self.ignored_tables]


class DatabaseWrapper(TenantsDatabaseWrapper):  # type: ignore[misc]
    ops_class = Operations
    creation_class = Creation
    SchemaEditorClass = SchemaEditor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.introspection = Introspection(self)  # django-tenants sets its own here, not by class
        self._savepoints_in_transaction = 0

    def savepoint_name_in_transaction(self, prefix: str) -> str:
        """A savepoint name not used before in the current transaction (fastpath.compiled's
        batches). The count restarts when a transaction ends, so the next one sends the same
        text again (psycopg converts a text once)."""
        self._savepoints_in_transaction += 1
        return f"{prefix}_{self._savepoints_in_transaction}"

    def _count_restarted_if_transaction_ended(self) -> None:
        # psycopg can refuse a commit before sending it (inside its own `transaction()`
        # block, say): the transaction is still open then, and so is its count.
        if self.connection is None or self.connection.info.transaction_status in (TransactionStatus.IDLE, TransactionStatus.UNKNOWN):
            self._savepoints_in_transaction = 0

    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            self._count_restarted_if_transaction_ended()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._count_restarted_if_transaction_ended()

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        # Registered hot statements go prepared (fastpath.prepared), unless server-side binding
        # is asked for (psycopg prepares by itself then) or they are turned off.
        if params.get("cursor_factory") is Cursor and getattr(settings, "TALLY_DB_PREPARED_STATEMENTS", True):
            params["cursor_factory"] = PreparingCursor
        return params
