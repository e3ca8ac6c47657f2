"""Rows that FK-less hot tables point at can never disappear (SPEC 3, integrity).

wallets/0004-0005 and payments/0003-0005 dropped the database foreign keys from the
append-only hot tables (ledger entries -> transaction, account, asset; payments ->
customer, merchant, store, terminal, asset, ledger transaction) for throughput. Without
them nothing in the database stops a referenced row from being deleted, leaving entries
that point at nothing. These triggers put the guarantee back where it is cheap: on the
referenced (cold) tables, which no code path deletes from. DELETE is refused, and so is
changing a primary key (a foreign key would have refused that too). The ledger
transaction table is already append-only (0003).

Like 0003, the function lives in the tenant schema and names no schema, so the template
schema's copy (with its triggers) is cloned into every new tenant.
`wallets.selectors.ledger_orphan_references` is the detective control behind it.
"""

from django.db import migrations

# (table, primary key column)
GUARDED = (
    ("wallets_account", "id"),
    ("wallets_asset", "code"),
    ("wallets_customer", "id"),
    ("wallets_merchant", "id"),
    ("wallets_store", "id"),
    ("wallets_terminal", "id"),
)

FUNCTION = """
CREATE OR REPLACE FUNCTION tally_referenced_row_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'referenced row: % on % refused (ledger entries and payments point at it without a database foreign key)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;
"""


def _forward() -> str:
    sql = [FUNCTION]
    for table, pk in GUARDED:
        sql.append(
            f"CREATE TRIGGER {table}_undeletable BEFORE DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION tally_referenced_row_guard();"
        )
        sql.append(
            f"CREATE TRIGGER {table}_pk_immutable BEFORE UPDATE OF {pk} ON {table} "
            f"FOR EACH ROW WHEN (OLD.{pk} IS DISTINCT FROM NEW.{pk}) EXECUTE FUNCTION tally_referenced_row_guard();"
        )
    return "\n".join(sql)


def _backward() -> str:
    sql = []
    for table, _pk in GUARDED:
        sql.append(f"DROP TRIGGER IF EXISTS {table}_pk_immutable ON {table};")
        sql.append(f"DROP TRIGGER IF EXISTS {table}_undeletable ON {table};")
    sql.append("DROP FUNCTION IF EXISTS tally_referenced_row_guard();")
    return "\n".join(sql)


class Migration(migrations.Migration):
    dependencies = [("wallets", "0005_ledger_no_hot_fks")]

    operations = [migrations.RunSQL(_forward(), _backward())]
