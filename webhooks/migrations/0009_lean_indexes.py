"""A smaller tenant: the `varchar_pattern_ops` twins of the webhook tables' text indexes
(their prefixed ids; no query runs `LIKE 'prefix%'` on them), and the foreign-key indexes a
composite index already leads with: a delivery's endpoint (webhookdelivery_endpoint and the
once-per-endpoint pair), an attempt's delivery (webhookattempt_delivery), an endpoint's
merchant (webhookendpoint_merchant).
"""

import django.db.models.deletion
from django.db import migrations, models

from tenants.schemas import indexes_drop_sql


class Migration(migrations.Migration):

    dependencies = [
        ('wallets', '0021_lean_indexes'),
        ('webhooks', '0008_endpoint_enabled_at'),
    ]

    operations = [
        migrations.RunSQL(indexes_drop_sql(table_prefixes=['webhooks_']), reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='webhookdelivery',
            name='endpoint',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='deliveries', to='webhooks.webhookendpoint'),
        ),
        migrations.AlterField(
            model_name='webhookdeliveryattempt',
            name='delivery',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='attempt_log', to='webhooks.webhookdelivery'),
        ),
        migrations.AlterField(
            model_name='webhookendpoint',
            name='merchant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='webhook_endpoints', to='wallets.merchant'),
        ),
    ]
