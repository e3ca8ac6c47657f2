"""A new tenant's schema made from the migrated template in one transaction, at a cost
that does not grow with the number of tenants (docs/ARCHITECTURE.md, "Tenants"; why
django-tenants' `clone_schema` does: docs/BENCHMARKS.md, "A thousand tenants").

Read under `search_path = <template>`, the deparsed definitions name no schema, except the
table `pg_get_indexdef`, `pg_get_triggerdef` and `pg_get_functiondef` always qualify, which
is rewritten exactly. What migrations make here is copied; any other kind of object is
refused loudly rather than left out (tests/test_tenant_schemas.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader

_TRIGGER_ENABLED = {"O": "", "D": "DISABLE TRIGGER", "R": "ENABLE REPLICA TRIGGER", "A": "ENABLE ALWAYS TRIGGER"}


class SchemaCloneRefused(Exception):
    """The template holds an object the clone does not know how to copy."""


@dataclass(frozen=True)
class SchemaScript:
    """A template's schema as statements that name no schema (run them under the new
    schema's search_path), its rows and sequence states copied before any index exists."""

    statements: tuple[str, ...]


def _fetch(cursor: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    cursor.execute(sql, params)
    return list(cursor.fetchall())


def _unsupported(cursor: Any, nsp: int) -> list[str]:
    found = []
    for what, sql in (
        ("relation of kind", "SELECT relkind::text || ' ' || relname FROM pg_class WHERE relnamespace = %s AND relkind NOT IN ('r', 'i', 'S')"),
        ("type", "SELECT typname FROM pg_type t WHERE typnamespace = %s AND (typtype <> 'b' AND typrelid = 0"
                 " OR typrelid <> 0 AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind = 'r'))"),
        ("routine of kind", "SELECT prokind::text || ' ' || proname FROM pg_proc WHERE pronamespace = %s AND prokind NOT IN ('f', 'p')"),
        ("policy or row security on", "SELECT relname FROM pg_class WHERE relnamespace = %s AND (relrowsecurity OR relhasrules AND relkind = 'r')"),
        ("inheritance on", "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relnamespace = %s"),
        ("statistics object", "SELECT stxname FROM pg_statistic_ext WHERE stxnamespace = %s"),
        ("collation", "SELECT collname FROM pg_collation WHERE collnamespace = %s"),
        ("operator", "SELECT oprname FROM pg_operator WHERE oprnamespace = %s"),
    ):
        found += [f"{what} {name}" for (name,) in _fetch(cursor, sql, [nsp])]
    return found


def schema_script_capture(*, source: str) -> SchemaScript:
    """Read the template schema's definition from the catalog, by its namespace (schema_clone
    reuses it while the template's migrations are unchanged: `_script_cache`)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT oid, quote_ident(nspname) FROM pg_namespace WHERE nspname = %s", [source])
        found = cursor.fetchone()
        if found is None:
            raise SchemaCloneRefused(f"no schema {source!r}")
        nsp, qsource = found
        refused = _unsupported(cursor, nsp)
        if refused:
            raise SchemaCloneRefused(f"template {source!r} holds what the clone cannot copy: {', '.join(refused)}")
        # Deparse relative to the template alone: its own names come out unqualified, and a
        # reference to any other schema (public) stays qualified. One cursor throughout: a
        # new one may set the connection's own search_path again (django-tenants).
        cursor.execute("SELECT set_config('search_path', %s, true)", [qsource])
        cursor.execute("SET LOCAL check_function_bodies = off")
        script = _capture(cursor, nsp, source, qsource)
    return script


def _capture(cursor: Any, nsp: int, source: str, qsource: str) -> SchemaScript:
    before: list[str] = ["SET LOCAL check_function_bodies = off"]
    rows: list[str] = []
    after: list[str] = []

    def catalog(sql: str) -> list[tuple[Any, ...]]:
        return _fetch(cursor, sql, [nsp])

    for (definition, name) in catalog("SELECT pg_get_functiondef(oid), proname FROM pg_proc WHERE pronamespace = %s ORDER BY oid"):
        header, _, rest = definition.partition("\n")
        qualified = f" {qsource}."
        if header.count(qualified) != 1:
            raise SchemaCloneRefused(f"function {name}: unexpected header {header!r}")
        # A body (or a SET search_path clause) is copied as written: one naming the template
        # would make every tenant's copy act on the template's tables.
        if source in rest or qsource in rest:
            raise SchemaCloneRefused(f"function {name} names the template schema {source!r}: a copy would act on it")
        before.append(header.replace(qualified, " ", 1) + "\n" + rest)

    # Sequences not made by an identity column, before the tables whose defaults name them.
    owned_by: list[str] = []
    for (qname, type_, start, inc, minv, maxv, cache, cycle, owner_table, owner_col) in catalog(
        """
        SELECT quote_ident(c.relname), format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
               s.seqcache, s.seqcycle, quote_ident(t.relname), quote_ident(a.attname)
          FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid
          LEFT JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
               AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
          LEFT JOIN pg_class t ON t.oid = d.refobjid
          LEFT JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
         WHERE c.relnamespace = %s AND c.relkind = 'S'
           AND NOT EXISTS (SELECT 1 FROM pg_depend i WHERE i.classid = 'pg_class'::regclass AND i.objid = c.oid AND i.deptype = 'i')
         ORDER BY c.oid
        """
    ):
        before.append(f"CREATE SEQUENCE {qname} AS {type_} {_sequence_options(start, inc, minv, maxv, cache, cycle)}")
        if owner_table is not None:
            owned_by.append(f"ALTER SEQUENCE {qname} OWNED BY {owner_table}.{owner_col}")

    tables = catalog(
        "SELECT oid, quote_ident(relname), relpersistence, reloptions, obj_description(oid, 'pg_class')"
        " FROM pg_class WHERE relnamespace = %s AND relkind = 'r' ORDER BY oid"
    )
    columns: dict[int, list[tuple[Any, ...]]] = {}
    for row in catalog(
        """
        SELECT a.attrelid, quote_ident(a.attname), format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
               a.attgenerated, pg_get_expr(d.adbin, d.adrelid),
               CASE WHEN a.attcollation <> t.typcollation THEN quote_ident(co.collname) END,
               col_description(a.attrelid, a.attnum),
               quote_ident(sc.relname), s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_type t ON t.oid = a.atttypid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation
          LEFT JOIN pg_depend dep ON a.attidentity <> '' AND dep.refclassid = 'pg_class'::regclass AND dep.refobjid = a.attrelid
               AND dep.refobjsubid = a.attnum AND dep.classid = 'pg_class'::regclass AND dep.deptype = 'i'
          LEFT JOIN pg_class sc ON sc.oid = dep.objid
          LEFT JOIN pg_sequence s ON s.seqrelid = dep.objid
         WHERE c.relnamespace = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attrelid, a.attnum
        """
    ):
        columns.setdefault(row[0], []).append(row[1:])

    for (oid, qtable, persistence, reloptions, comment) in tables:
        parts = []
        copied = []
        for (qcol, type_, notnull, identity, generated, default, collation, col_comment, qseq, *seq) in columns.get(oid, []):
            part = f"{qcol} {type_}"
            if collation:
                part += f" COLLATE {collation}"
            if generated == "s":
                part += f" GENERATED ALWAYS AS ({default}) STORED"
            elif default is not None:
                part += f" DEFAULT {default}"
            if identity:
                kind = "ALWAYS" if identity == "a" else "BY DEFAULT"
                part += f" GENERATED {kind} AS IDENTITY (SEQUENCE NAME {qseq} {_sequence_options(*seq)})"
            if notnull:
                part += " NOT NULL"
            parts.append(part)
            if generated != "s":
                copied.append(qcol)
            if col_comment is not None:
                after.append(f"COMMENT ON COLUMN {qtable}.{qcol} IS {_literal(col_comment)}")
        unlogged = "UNLOGGED " if persistence == "u" else ""
        options = f" WITH ({', '.join(reloptions)})" if reloptions else ""
        before.append(f"CREATE {unlogged}TABLE {qtable} ({', '.join(parts)}){options}")
        if comment is not None:
            after.append(f"COMMENT ON TABLE {qtable} IS {_literal(comment)}")
        if copied:
            cols = ", ".join(copied)
            # Rows go in before any index, constraint or trigger exists (as pg_dump orders it).
            rows.append(f"INSERT INTO {qtable} ({cols}) OVERRIDING SYSTEM VALUE SELECT {cols} FROM {qsource}.{qtable}")  # noqa: S608 - quoted by PostgreSQL
    before += owned_by

    for (qseq,) in catalog("SELECT quote_ident(relname) FROM pg_class WHERE relnamespace = %s AND relkind = 'S' ORDER BY oid"):
        rows.append(f"SELECT setval({_literal(qseq)}, last_value, is_called) FROM {qsource}.{qseq}")  # noqa: S608 - quoted by PostgreSQL

    # Constraints: the ones that make indexes first (a foreign key needs its target's), then
    # checks, then foreign keys once every table exists.
    for (qtable, qname, definition) in catalog(
        """
        SELECT quote_ident(c.relname), quote_ident(con.conname), pg_get_constraintdef(con.oid)
          FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
         WHERE con.connamespace = %s AND c.relkind = 'r'
         ORDER BY array_position(ARRAY['p', 'u', 'x', 'c', 'f'], con.contype::text), con.oid
        """
    ):
        after.append(f"ALTER TABLE ONLY {qtable} ADD CONSTRAINT {qname} {definition}")

    for (qtable, definition) in catalog(
        """
        SELECT quote_ident(t.relname), pg_get_indexdef(i.indexrelid)
          FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
         WHERE ic.relnamespace = %s
           AND NOT EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = i.indexrelid AND con.contype IN ('p', 'u', 'x'))
         ORDER BY i.indexrelid
        """
    ):
        after.append(_unqualify_on(definition, qsource, qtable))

    for (qtable, qname, definition, enabled) in catalog(
        """
        SELECT quote_ident(c.relname), quote_ident(t.tgname), pg_get_triggerdef(t.oid), t.tgenabled
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = %s AND NOT t.tgisinternal
         ORDER BY t.oid
        """
    ):
        after.append(_unqualify_on(definition, qsource, qtable))
        if _TRIGGER_ENABLED[enabled]:
            after.append(f"ALTER TABLE {qtable} {_TRIGGER_ENABLED[enabled]} {qname}")

    return SchemaScript(statements=(*before, *rows, *after))


def _sequence_options(start: int, inc: int, minv: int, maxv: int, cache: int, cycle: bool) -> str:
    return f"INCREMENT BY {inc} MINVALUE {minv} MAXVALUE {maxv} START WITH {start} CACHE {cache} {'CYCLE' if cycle else 'NO CYCLE'}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _unqualify_on(definition: str, qsource: str, qtable: str) -> str:
    qualified = f" ON {qsource}.{qtable} "
    if definition.count(qualified) != 1:
        raise SchemaCloneRefused(f"unexpected definition {definition!r}")
    return definition.replace(qualified, f" ON {qtable} ", 1)


# The template's script per process, keyed by its django_migrations: pg_class has no index on
# relnamespace, so each catalog query scans every schema's relations (20 ms at 500 tenants).
_script_cache: dict[str, tuple[tuple[int, int], SchemaScript]] = {}


def _script_for(cursor: Any, source: str) -> SchemaScript:
    cursor.execute("SELECT quote_ident(%s), to_regclass(quote_ident(%s) || '.django_migrations')", [source, source])
    qsource, migrations_table = cursor.fetchone()
    if migrations_table is None:
        return schema_script_capture(source=source)  # not a migrated template: nothing to key a cache by
    cursor.execute(f"SELECT count(*), coalesce(max(id), 0) FROM {qsource}.django_migrations")  # noqa: S608 - quoted by PostgreSQL
    count, last = cursor.fetchone()
    key = (int(count), int(last))
    cached = _script_cache.get(source)
    if cached is not None and cached[0] == key:
        return cached[1]
    script = schema_script_capture(source=source)
    _script_cache[source] = (key, script)
    return script


def clone_session_renew() -> bool:
    """Start a new database session for a clone, unless a transaction holds this one (then
    the clone runs on it, only slower). Returns whether it closed the old one.

    Each relcache invalidation of the clone's DDL walks every plan the session has saved
    (docs/BENCHMARKS.md, "A thousand tenants"). The next query opens a session again, with
    the schema django-tenants had set; what a caller keeps on the old one outside a
    transaction goes with it (a held cursor, a session advisory lock)."""
    if connection.in_atomic_block or (connection.connection is not None and not connection.get_autocommit()):
        return False
    connection.close()
    return True


def schema_clone(*, source: str, target: str) -> None:
    """Create schema `target` as a copy of `source` (structure and rows), in one
    transaction: a failure leaves no schema behind.

    Locks: none beyond PostgreSQL's own (ACCESS SHARE on the template's tables while their
    rows are read)."""
    with transaction.atomic(), connection.cursor() as cursor:
        script = _script_for(cursor, source)
        cursor.execute("SELECT quote_ident(%s)", [target])
        (qtarget,) = cursor.fetchone()
        cursor.execute(f"CREATE SCHEMA {qtarget}")
        cursor.execute("SELECT set_config('search_path', %s, true)", [qtarget])
        cursor.execute(";\n".join(script.statements))
    # The wrapper caches the search path it last set; ours was local to the transaction.
    connection.search_path_set_schemas = None  # type: ignore[attr-defined]  # django-tenants' database wrapper


@functools.cache
def migrations_on_disk() -> frozenset[tuple[str, str]]:
    """Every migration of the graph on disk, a squash standing for what it replaces (read
    once per process: the files do not change under a running process)."""
    return frozenset(MigrationLoader(None, ignore_no_migrations=True).graph.nodes)


# Schemas a statement of `schemas_missing_migrations` counts: one UNION ALL over every schema
# could not be parsed past about 10,000 branches (`stack depth limit exceeded`).
MISSING_MIGRATIONS_BATCH = 500


def schemas_missing_migrations(*, schemas: Sequence[str]) -> dict[str, int]:
    """For each schema, how many migrations on disk its django_migrations does not hold (0:
    nothing to migrate): one query finds which schemas have the table, then one a batch of
    MISSING_MIGRATIONS_BATCH counts them (no search_path set per schema). Every migration
    counts, not only each app's last: a schema missing an earlier one (a --fake, a migration
    merged into history) is behind; one without the table misses them all."""
    known = sorted(migrations_on_disk())
    if not schemas:
        return {}
    with connection.cursor() as cursor:
        found = _fetch(
            cursor,
            "SELECT s, quote_ident(s), EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = s AND c.relname = 'django_migrations' AND c.relkind = 'r')"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS u(s, i) ORDER BY i",
            [list(schemas)],
        )
        missing = {schema: len(known) for schema, _, present in found if not present}
        ordered = [(schema, quoted) for schema, quoted, present in found if present]
        if not ordered:
            return missing
        known_columns = [[app for app, _ in known], [name for _, name in known]]
        for start in range(0, len(ordered), MISSING_MIGRATIONS_BATCH):
            # One statement a batch: a count per schema of the migrations on disk it holds.
            union = " UNION ALL ".join(
                f"SELECT {i} AS i, count(*) AS held FROM {q}.django_migrations m"  # noqa: S608 - quoted by PostgreSQL
                f" JOIN known k ON k.app = m.app AND k.name = m.name"
                for i, (_, q) in enumerate(ordered[start : start + MISSING_MIGRATIONS_BATCH], start)
            )
            sql = f"WITH known AS (SELECT * FROM unnest(%s::text[], %s::text[]) AS k(app, name)) {union}"  # noqa: S608 - see above
            for i, held in _fetch(cursor, sql, known_columns):
                missing[ordered[i][0]] = len(known) - int(held)
    return missing

