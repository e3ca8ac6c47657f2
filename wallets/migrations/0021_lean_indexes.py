"""A smaller tenant: indexes that no query needs.

- The `varchar_pattern_ops` twins Django built beside the index of every indexed or unique
  text column of wallets and of the per-tenant Django apps (auth, admin, sessions,
  contenttypes, axes). They serve only `LIKE 'prefix%'`, which no query here runs on those
  columns (ids, key hashes, usernames); `fastpath.backend`'s schema editor builds no more.
- auth's own index of a foreign key that leads a unique pair on the same table
  (user_groups, user_user_permissions, group_permissions, permission's content type): the
  pair's index serves the same lookups.
- A hold's account, asset and reference: no query looks holds up by them (a hold is read by
  its id) and accounts and assets cannot be deleted (wallets 0006), so nothing checks them.
"""

import django.db.models.deletion
from django.db import migrations, models

from tenants.schemas import indexes_drop_sql


class Migration(migrations.Migration):

    dependencies = [
        ('axes', '0010_accessattemptexpiration'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('sessions', '0001_initial'),
        ('admin', '0003_logentry_add_action_flag_choices'),
        ('auth', '0012_alter_user_first_name_max_length'),
        ('wallets', '0020_ledgerentry_created_brin'),
    ]

    operations = [
        migrations.RunSQL(indexes_drop_sql(table_prefixes=['wallets_', 'auth_', 'axes_', 'django_'], names=['auth_group_permissions_group_id_b120cbf9', 'auth_permission_content_type_id_2f476e4b', 'auth_user_groups_user_id_6a12ed8b', 'auth_user_user_permissions_user_id_a95ead1b']), reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='hold',
            name='account',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='holds', to='wallets.account'),
        ),
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
    ]
