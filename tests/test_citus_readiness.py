"""What Citus schema-based sharding would require of Tally's models, checked on the migrated
test database (docs/SCALING.md, "Citus").

Citus (12.0 and later) can place each tenant schema on one worker node. It refuses to
distribute a schema, or to create a table in a distributed one, when a table in it (Citus's
`EnsureTenantTable`, src/backend/distributed/commands/schema_based_sharding.c):
- has a foreign key to a table of another schema that is not a reference table;
- is referenced by a foreign key from a table of another schema;
- inherits or is inherited, or is a partition of a table in another schema;
- is a foreign table, or is owned by an extension (nor may the schema be an extension's).
Sequences and identity columns are allowed: they live in the schema and move with it. The
catalog checks below are those rules, read from pg_constraint, pg_inherits, pg_class and
pg_depend; each is shown to fail on a probe schema built to break it.

Queries. No test can prove that no query ever joins two tenants' schemas. What is checked:
- statically, that no SQL text in the code that serves tenants (wallets, payments, webhooks,
  reconciliation, apikit, fastpath, their migrations included) names a schema other than
  PostgreSQL's own catalogs and public, nor sets the search_path itself. Text built at run time
  (f-strings) is checked for what it spells out; a placeholder that expanded to a qualified
  name would pass unseen, and the known ones expand to a model's unqualified db_table;
- at run time, that a payment, a refund and a reconciliation run in one tenant send no
  statement naming a schema (public aside), so each resolves through that tenant's search_path (the
  tenant's schema, then public) and cannot reach another tenant's tables.
Platform code (tenants/, config/: tenant creation, migrations) is outside both checks: it
runs on the coordinator and copies or alters schemas by design.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tenants.models import Tenant

ROOT = Path(__file__).resolve().parent.parent

# Public tables that would be Citus reference tables (copied to every node), which a tenant
# table may therefore reference. None today: no tenant table references a public one
# (docs/SCALING.md says which table would be the candidate and why none is needed).
REFERENCE_TABLES: frozenset[str] = frozenset()

TENANT_SERVING_CODE = ["wallets", "payments", "webhooks", "reconciliation", "apikit", "fastpath"]
# Schemas a statement may name: PostgreSQL's catalogs, and public, which is no tenant's (it
# stays on the coordinator; what tenant tables may hold to it is the catalog checks' part).
SYSTEM_SCHEMAS = {"pg_catalog", "information_schema", "public"}
# What reads as `schema.name` but is not a schema: a trigger's row variables.
NOT_SCHEMAS = {"new", "old"}


def tenant_schemas() -> list[str]:
    """Every schema that would be a distributed (tenant) schema: each tenant's and the template."""
    connection.set_schema_to_public()
    schemas = sorted(set(Tenant.objects.exclude(schema_name="public").values_list("schema_name", flat=True)))
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [settings.TENANT_BASE_SCHEMA])
        if cursor.fetchone():
            schemas.append(settings.TENANT_BASE_SCHEMA)
    return schemas


def citus_blockers(schemas: list[str], *, reference_tables: frozenset[str] = REFERENCE_TABLES) -> list[str]:
    """What would stop `citus_schema_distribute` on `schemas`, one line per object."""
    found: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.conname, rn.nspname, r.relname, fn.nspname, f.relname
            FROM pg_constraint c
            JOIN pg_class r ON r.oid = c.conrelid JOIN pg_namespace rn ON rn.oid = r.relnamespace
            JOIN pg_class f ON f.oid = c.confrelid JOIN pg_namespace fn ON fn.oid = f.relnamespace
            WHERE c.contype = 'f' AND rn.nspname <> fn.nspname AND (rn.nspname = ANY(%s) OR fn.nspname = ANY(%s))
            ORDER BY 2, 3, 1
            """,
            [schemas, schemas],
        )
        for name, from_schema, from_table, to_schema, to_table in cursor.fetchall():
            target = f"{to_schema}.{to_table}"
            if from_schema in schemas and to_schema not in schemas and target in reference_tables:
                continue
            found.append(f"foreign key {name}: {from_schema}.{from_table} -> {target}")
        cursor.execute(
            """
            SELECT cn.nspname, c.relname, pn.nspname, p.relname, c.relispartition
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace cn ON cn.oid = c.relnamespace
            JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace pn ON pn.oid = p.relnamespace
            WHERE cn.nspname = ANY(%s) OR pn.nspname = ANY(%s)
            ORDER BY 1, 2
            """,
            [schemas, schemas],
        )
        for child_schema, child, parent_schema, parent, is_partition in cursor.fetchall():
            if is_partition and child_schema == parent_schema:
                continue  # partitioning inside one schema is allowed
            found.append(f"{'partition' if is_partition else 'inheritance'}: {child_schema}.{child} of {parent_schema}.{parent}")
        cursor.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'f' AND n.nspname = ANY(%s) ORDER BY 1, 2",
            [schemas],
        )
        found += [f"foreign table: {schema}.{table}" for schema, table in cursor.fetchall()]
        cursor.execute(
            """
            SELECT n.nspname || '.' || c.relname FROM pg_depend d
            JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE d.deptype = 'e' AND n.nspname = ANY(%s)
            UNION ALL
            SELECT n.nspname FROM pg_depend d JOIN pg_namespace n ON d.classid = 'pg_namespace'::regclass AND n.oid = d.objid
            WHERE d.deptype = 'e' AND n.nspname = ANY(%s)
            UNION ALL
            SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE n.nspname = ANY(%s)
            """,
            [schemas, schemas, schemas],
        )
        found += [f"extension-owned: {name}" for (name,) in cursor.fetchall()]
    return found


# A relation named after FROM / JOIN / INTO / UPDATE / TABLE / REFERENCES with a schema in
# front: `s.t`, `"s"."t"`, or an f-string placeholder `{s}.t`.
_QUALIFIED = re.compile(
    r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE|REFERENCES)\s+(?:ONLY\s+)?(\"[^\"]+\"|[A-Za-z_][\w$]*|\{[^}]*\})\s*\.\s*[\"A-Za-z_{]",
    re.IGNORECASE,
)
_SEARCH_PATH = re.compile(r"\bsearch_path\b\s*(=|TO\b)|set_config\s*\(\s*'search_path'", re.IGNORECASE)
_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|ALTER|CREATE|SET)\b", re.IGNORECASE)


def schema_named_in(sql: str) -> list[str]:
    """The schema qualifiers `sql` names (PostgreSQL's catalogs aside), and a setting of the search_path."""
    named = [m.group(1).strip('"') for m in _QUALIFIED.finditer(sql) if m.group(1).strip('"').lower() not in SYSTEM_SCHEMAS | NOT_SCHEMAS]
    if _SEARCH_PATH.search(sql):
        named.append("search_path")
    return named


def _sql_texts(path: Path) -> list[tuple[int, str]]:
    """Each string constant and f-string of a module that reads as SQL, with its line
    (an f-string's placeholders kept as `{...}`); docstrings, which are prose, aside."""
    texts: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(), filename=str(path))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr))}
    for node in ast.walk(tree):
        if id(node) in prose:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "{...}" for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if _SQL.search(text):
            texts.append((node.lineno, text))
    return texts


@pytest.mark.django_db
def test_tenant_schemas_hold_what_schema_based_sharding_requires() -> None:
    schemas = tenant_schemas()
    assert {"test_a", "test_b", settings.TENANT_BASE_SCHEMA} <= set(schemas), schemas
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname = %s",
                       ["test_a"])
        assert cursor.fetchone()[0] > 30  # the checks below looked at a migrated tenant, not an empty one
    assert citus_blockers(schemas) == []


@pytest.mark.django_db
def test_the_catalog_checks_flag_what_citus_would_refuse() -> None:
    """A probe schema breaking each rule once, inside the test's rolled-back transaction;
    its sequence and identity column are allowed and not flagged."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE SCHEMA citus_probe;
            CREATE TABLE public.citus_probe_ref (id bigint PRIMARY KEY);
            CREATE TABLE citus_probe.ledger (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                seq bigserial,
                tenant_id bigint REFERENCES public.tenants_tenant (id),
                ref_id bigint REFERENCES public.citus_probe_ref (id)
            );
            CREATE TABLE public.citus_probe_in (ledger_id bigint REFERENCES citus_probe.ledger (id));
            CREATE TABLE citus_probe.child () INHERITS (citus_probe.ledger);
            CREATE TABLE citus_probe.by_day (day date NOT NULL) PARTITION BY RANGE (day);
            CREATE TABLE citus_probe.by_day_2026 PARTITION OF citus_probe.by_day FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
            CREATE TABLE public.by_day_2027 PARTITION OF citus_probe.by_day FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
            """
        )
    found = citus_blockers(["citus_probe"], reference_tables=frozenset({"public.citus_probe_ref"}))
    assert sorted(found) == sorted([
        "foreign key ledger_tenant_id_fkey: citus_probe.ledger -> public.tenants_tenant",  # public, not a reference table
        "foreign key citus_probe_in_ledger_id_fkey: public.citus_probe_in -> citus_probe.ledger",  # into a tenant schema
        "inheritance: citus_probe.child of citus_probe.ledger",
        "partition: public.by_day_2027 of citus_probe.by_day",  # a partition in another schema
    ]), found
    # The same FK to a would-be reference table is flagged once that table is not listed as one.
    assert any("public.citus_probe_ref" in line for line in citus_blockers(["citus_probe"], reference_tables=frozenset()))


def test_no_sql_in_the_tenant_serving_code_names_a_schema() -> None:
    named: list[str] = []
    scanned = 0
    for package in TENANT_SERVING_CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in _sql_texts(path):
                scanned += 1
                named += [f"{path.relative_to(ROOT)}:{line}: {schema}" for schema in schema_named_in(text)]
    assert scanned > 50  # it read the SQL there is (the migrations' guards, the compiled statements, the raw reads)
    assert named == []


def test_the_sql_scan_flags_a_statement_naming_two_schemas() -> None:
    assert schema_named_in('SELECT * FROM test_a.wallets_account a JOIN "test_b"."wallets_account" b ON a.id = b.id') == ["test_a", "test_b"]
    assert schema_named_in("INSERT INTO {...}.ledger_entry SELECT 1") == ["{...}"]
    assert schema_named_in("SET search_path = test_b, public") == ["search_path"]
    assert schema_named_in("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()") == []
    assert schema_named_in("SELECT id FROM wallets_account WHERE id = %s FOR UPDATE") == []
    assert schema_named_in("SELECT 1 FROM public.tenants_tenant t JOIN test_a.wallets_account a ON true") == ["test_a"]
    assert schema_named_in("CREATE TRIGGER t BEFORE UPDATE ON x FOR EACH ROW WHEN (OLD.a IS DISTINCT FROM NEW.a) EXECUTE FUNCTION f()") == []


def test_a_tenants_payment_refund_and_reconciliation_name_no_schema(tenant: Tenant) -> None:
    from payments.services.charges import payment_create
    from payments.services.refunds import refund_create
    from reconciliation.models import RunTrigger
    from reconciliation.services import reconciliation_run_execute, reconciliation_run_request
    from tests.conftest import statements_sent
    from tests.factories import CustomerFactory, TerminalFactory, fund

    customer = CustomerFactory()
    terminal = TerminalFactory()
    fund(customer, 5000)

    def work() -> Any:
        payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1200)
        refund_create(payment=payment, amount=200)
        run = reconciliation_run_request(trigger=RunTrigger.COMMAND)
        return reconciliation_run_execute(run_id=run.pk)

    sent = statements_sent(work)
    assert len(sent) > 20
    named = [(sql, schema_named_in(sql)) for sql, _ in sent if schema_named_in(sql)]
    assert named == []
