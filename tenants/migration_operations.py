"""Migration operations that change a tenant's indexes without stopping its writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import router
from django.db.migrations.operations.base import Operation


class IndexesDropConcurrently(Operation):
    """Drop indexes in the schema the migration runs in with `DROP INDEX CONCURRENTLY`:
    the tenant's reads and writes go on meanwhile (a plain DROP INDEX holds the table's
    ACCESS EXCLUSIVE lock until the migration commits). The migration must be
    `atomic = False`. Takes no row locks; each drop waits for the transactions already
    using its table to end.

    `indexes` are (index, table, column) triples, which the way back builds again
    (CONCURRENTLY too). `pattern_ops_of` are table-name prefixes: the `varchar_pattern_ops`/
    `text_pattern_ops` twins Django built beside those tables' text indexes are dropped as
    well (they serve only `LIKE 'prefix%'`, which no query here runs on such a column, and
    `fastpath.backend`'s schema editor builds no more); the way back leaves them out.
    Changes no model state: pair it with the AlterFields in a SeparateDatabaseAndState."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, *, indexes: Sequence[tuple[str, str, str]] = (), pattern_ops_of: Sequence[str] = ()) -> None:
        self.indexes = [tuple(index) for index in indexes]
        self.pattern_ops_of = list(pattern_ops_of)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [], {"indexes": self.indexes, "pattern_ops_of": self.pattern_ops_of}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        return f"Drop {len(self.indexes)} indexes and the pattern_ops twins of {', '.join(self.pattern_ops_of) or 'no tables'}, concurrently"

    def _pattern_ops_twins(self, schema_editor: Any) -> list[str]:
        if not self.pattern_ops_of:
            return []
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT DISTINCT i.relname
                  FROM pg_catalog.pg_index x
                  JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
                  JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
                  JOIN pg_catalog.pg_namespace n ON n.oid = i.relnamespace
                  JOIN pg_catalog.pg_opclass o ON o.oid = ANY (x.indclass::oid[])
                 WHERE n.nspname = current_schema()
                   AND o.opcname IN ('varchar_pattern_ops', 'text_pattern_ops')
                   AND t.relname LIKE ANY (%s)
                 ORDER BY 1
                """,
                [[prefix.replace("_", "\\_") + "%" for prefix in self.pattern_ops_of]],
            )
            return [name for (name,) in cursor.fetchall()]

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not router.allow_migrate(schema_editor.connection.alias, app_label):
            return
        quote = schema_editor.quote_name
        for name in [index for index, _table, _column in self.indexes] + self._pattern_ops_twins(schema_editor):
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(name)}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not router.allow_migrate(schema_editor.connection.alias, app_label):
            return
        quote = schema_editor.quote_name
        for name, table, column in self.indexes:
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {quote(name)} ON {quote(table)} ({quote(column)})")
