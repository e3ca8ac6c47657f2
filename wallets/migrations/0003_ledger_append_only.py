"""The database itself refuses UPDATE and DELETE on ledger transactions and entries (SPEC 3).

The trigger function lives in the tenant schema and names no schema, so the template
schema's copy is cloned (with its triggers) into every new tenant.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION tally_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger is append-only: % on % refused (post a reversing transaction instead)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER ledgertransaction_append_only BEFORE UPDATE OR DELETE ON wallets_ledgertransaction
    FOR EACH ROW EXECUTE FUNCTION tally_ledger_append_only();
CREATE TRIGGER ledgerentry_append_only BEFORE UPDATE OR DELETE ON wallets_ledgerentry
    FOR EACH ROW EXECUTE FUNCTION tally_ledger_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS ledgerentry_append_only ON wallets_ledgerentry;
DROP TRIGGER IF EXISTS ledgertransaction_append_only ON wallets_ledgertransaction;
DROP FUNCTION IF EXISTS tally_ledger_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("wallets", "0002_ledger")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
