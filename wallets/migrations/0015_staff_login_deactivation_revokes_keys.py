"""A guard: a staff login that is deactivated, or loses its staff status, however it is
done (a save, QuerySet.update, bulk_update, raw SQL), loses every live API key in the same
statement, with one audit entry per key (actor `database`). The Python service
(`staff_login_deactivation_apply`, on pre_save) stays the main path: it revokes first, so
this trigger then finds nothing left to do; it is the backstop for writes that send no
signal, so that a reactivated login never gets its old keys back.

It lives in the tenant schema (auth_user, wallets_apikey and wallets_staffmember are per
tenant) and names no schema: its statement is built on the schema of the row's own table
(TG_TABLE_SCHEMA), so it acts on that tenant's keys whatever the search_path, and the
template's copy is cloned into every new tenant (tenants.schemas).
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION tally_staff_login_keys_revoke() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'WITH revoked AS ('
        '    UPDATE %1$I.wallets_apikey k SET revoked_at = now() FROM %1$I.wallets_staffmember s'
        '     WHERE s.user_id = $1 AND k.staff_id = s.id AND k.revoked_at IS NULL'
        '    RETURNING k.id, k.prefix, s.id AS staff_id'
        ') INSERT INTO %1$I.wallets_auditentry'
        '    (created, actor, action, target_type, target_id, before, after, reason, via, ip, request_id)'
        '  SELECT now(), ''database'', ''api_key.revoke'', ''api_key'', id,'
        '         jsonb_build_object(''prefix'', prefix, ''principal'', staff_id, ''revoked_at'', NULL),'
        '         jsonb_build_object(''revoked_at'', now()),'
        '         ''staff login deactivated or no longer staff'', ''system'', NULL, '''''
        '    FROM revoked ORDER BY id',
        TG_TABLE_SCHEMA
    ) USING NEW.id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER auth_user_deactivation_revokes_staff_keys AFTER UPDATE OF is_active, is_staff ON auth_user
    FOR EACH ROW WHEN (OLD.is_active AND NOT NEW.is_active OR OLD.is_staff AND NOT NEW.is_staff)
    EXECUTE FUNCTION tally_staff_login_keys_revoke();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS auth_user_deactivation_revokes_staff_keys ON auth_user;
DROP FUNCTION IF EXISTS tally_staff_login_keys_revoke();
"""


class Migration(migrations.Migration):
    dependencies = [("wallets", "0014_admin_names"), ("auth", "0012_alter_user_first_name_max_length")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
