"""A smaller tenant: indexes that no query needs, dropped CONCURRENTLY (the tenant's
reads and writes go on; the model state changes apart, so Django does not drop and re-add
the foreign keys, which would check every row under a lock).

- The `varchar_pattern_ops` twins Django built beside the index of every indexed or unique
  text column of wallets and of the per-tenant Django apps (auth, admin, sessions,
  contenttypes, axes): they serve only `LIKE 'prefix%'`, which no query here runs on those
  columns (ids, key hashes, usernames).
- auth's own index of a foreign key that leads a unique pair on the same table
  (user_groups, user_user_permissions, group_permissions, permission's content type): the
  pair's index serves the same lookups.
- A hold's asset and reference: no query looks holds up by them (a hold is read by its id,
  or through its intent) and assets cannot be deleted (wallets 0006).
"""

import django.db.models.deletion
from django.db import migrations, models

from tenants.migration_operations import IndexesDropConcurrently


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY

    dependencies = [
        ('axes', '0010_accessattemptexpiration'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('sessions', '0001_initial'),
        ('admin', '0003_logentry_add_action_flag_choices'),
        ('auth', '0012_alter_user_first_name_max_length'),
        ('wallets', '0020_ledgerentry_created_brin'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='hold',
                    name='asset',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
                ),
                migrations.AlterField(
                    model_name='hold',
                    name='reference',
                    field=models.CharField(max_length=32),
                ),
            ],
            database_operations=[
                IndexesDropConcurrently(
                    indexes=[
                        ('auth_group_permissions_group_id_b120cbf9', 'auth_group_permissions', 'group_id'),
                        ('auth_permission_content_type_id_2f476e4b', 'auth_permission', 'content_type_id'),
                        ('auth_user_groups_user_id_6a12ed8b', 'auth_user_groups', 'user_id'),
                        ('auth_user_user_permissions_user_id_a95ead1b', 'auth_user_user_permissions', 'user_id'),
                        ('wallets_hold_asset_id_f95089fa', 'wallets_hold', 'asset_id'),
                        ('wallets_hold_reference_0dfae230', 'wallets_hold', 'reference'),
                    ],
                    pattern_ops_of=['wallets_', 'auth_', 'axes_', 'django_'],
                ),
            ],
        ),
    ]
