"""The database refuses UPDATE, DELETE and TRUNCATE on the audit log (a guard): an entry,
once written, is there for good. Same pattern as the ledger's (0003)."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION tally_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER auditentry_append_only BEFORE UPDATE OR DELETE ON wallets_auditentry
    FOR EACH ROW EXECUTE FUNCTION tally_audit_append_only();
CREATE TRIGGER auditentry_no_truncate BEFORE TRUNCATE ON wallets_auditentry
    FOR EACH STATEMENT EXECUTE FUNCTION tally_audit_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS auditentry_no_truncate ON wallets_auditentry;
DROP TRIGGER IF EXISTS auditentry_append_only ON wallets_auditentry;
DROP FUNCTION IF EXISTS tally_audit_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("wallets", "0009_back_office")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
