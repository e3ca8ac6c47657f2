"""A schema's shape as plain data, to compare two schemas (a cloned tenant against one made
by running every migration) and name every difference.

Written apart from tenants.schemas on purpose: it reads every catalog row of the schema by
kind, so an object the clone forgot shows up here as missing, not as equal. Definitions
are deparsed under `search_path = <schema>` alone, so a default, foreign key or trigger
that points into another schema (the template's sequence or function) comes out
qualified and differs.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

QUERIES: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text, c.reloptions::text, c.relrowsecurity,
               obj_description(c.oid, 'pg_class')
          FROM pg_class c WHERE c.relnamespace = %(nsp)s""",
    "columns": """
        SELECT c.relname, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum), a.attname,
               format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity::text, a.attgenerated::text,
               pg_get_expr(d.adbin, d.adrelid), a.attcollation::regcollation::text, col_description(c.oid, a.attnum)
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = %(nsp)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT c.relname, con.conname, con.contype::text, pg_get_constraintdef(con.oid), con.condeferrable,
               con.condeferred, con.convalidated, ic.relname
          FROM pg_constraint con LEFT JOIN pg_class c ON c.oid = con.conrelid
          LEFT JOIN pg_class ic ON ic.oid = con.conindid
         WHERE con.connamespace = %(nsp)s""",
    "indexes": """
        SELECT t.relname, ic.relname, replace(pg_get_indexdef(i.indexrelid), %(qualified)s, ' ON '),
               i.indisunique, i.indisprimary, i.indisvalid
          FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
         WHERE ic.relnamespace = %(nsp)s""",
    "triggers": """
        SELECT c.relname, t.tgname, replace(pg_get_triggerdef(t.oid), %(qualified)s, ' ON '), t.tgenabled::text
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = %(nsp)s AND NOT t.tgisinternal""",
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
               s.seqcache, s.seqcycle, t.relname, a.attname, d.deptype::text
          FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
          LEFT JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
               AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
          LEFT JOIN pg_class t ON t.oid = d.refobjid
          LEFT JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
         WHERE c.relnamespace = %(nsp)s""",
    "routines": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prokind::text,
               replace(pg_get_functiondef(p.oid), %(qualified_fn)s, ' ')
          FROM pg_proc p WHERE p.pronamespace = %(nsp)s""",
    "types": """
        SELECT t.typname, t.typtype::text FROM pg_type t
         WHERE t.typnamespace = %(nsp)s""",
    "policies": """
        SELECT c.relname, p.polname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
         WHERE c.relnamespace = %(nsp)s""",
    "rules": """
        SELECT c.relname, r.rulename FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
         WHERE c.relnamespace = %(nsp)s""",
}

# Rows the migrations leave in a tenant schema (post_migrate fills content types and
# permissions), compared as sets with their ids.
ROWS: dict[str, str] = {
    "django_migrations": "SELECT app, name FROM django_migrations",
    "django_content_type": "SELECT id, app_label, model FROM django_content_type",
    "auth_permission": "SELECT p.id, p.codename, p.name, ct.app_label, ct.model FROM auth_permission p"
                       " JOIN django_content_type ct ON ct.id = p.content_type_id",
}


def schema_shape(schema: str) -> dict[str, set[tuple[Any, ...]]]:
    """Every object of `schema` by kind, and its seeded rows and sequence positions."""
    shape: dict[str, set[tuple[Any, ...]]] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT oid, quote_ident(nspname) FROM pg_namespace WHERE nspname = %s", [schema])
        nsp, qschema = cursor.fetchone()
        cursor.execute("SELECT set_config('search_path', %s, true)", [qschema])
        params = {"nsp": nsp, "qualified": f" ON {qschema}.", "qualified_fn": f" {qschema}."}
        for kind, sql in QUERIES.items():
            cursor.execute(sql, params)
            shape[kind] = set(map(tuple, cursor.fetchall()))
        for table, sql in ROWS.items():
            cursor.execute(sql)
            shape[f"rows:{table}"] = set(map(tuple, cursor.fetchall()))
        positions = set()
        for (seq,) in [(row[0],) for row in shape["sequences"]]:
            cursor.execute(f'SELECT last_value, is_called FROM "{seq}"')
            positions.add((seq, *cursor.fetchone()))
        shape["sequence_positions"] = positions
    connection.search_path_set_schemas = None  # the path above was local to the transaction
    return shape


def shape_differences(expected: dict[str, set[tuple[Any, ...]]], actual: dict[str, set[tuple[Any, ...]]]) -> list[str]:
    """Each difference as one readable line: what is only in one of the two."""
    lines = []
    for kind in sorted(set(expected) | set(actual)):
        left, right = expected.get(kind, set()), actual.get(kind, set())
        lines += [f"{kind}: missing {row!r}" for row in sorted(left - right, key=repr)]
        lines += [f"{kind}: extra {row!r}" for row in sorted(right - left, key=repr)]
    return lines


def one_migration_back(app: str) -> str:
    """The name of `app`'s migration before its newest on disk: where a test rolls a schema
    back to leave exactly one migration missing, whatever the app's newest is today."""
    from tenants.schemas import migrations_on_disk

    return sorted(name for label, name in migrations_on_disk() if label == app)[-2]
