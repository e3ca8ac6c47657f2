"""A smaller tenant, dropped CONCURRENTLY with the model state changed apart (so Django
does not drop and re-add the foreign keys): the `varchar_pattern_ops` twins of the webhook
tables' text indexes (their prefixed ids; no query runs `LIKE 'prefix%'` on them), and the
foreign-key indexes a composite index already leads with: a delivery's endpoint
(webhookdelivery_endpoint and the once-per-endpoint pair), an attempt's delivery
(webhookattempt_delivery), an endpoint's merchant (webhookendpoint_merchant).
"""

import django.db.models.deletion
from django.db import migrations, models

from tenants.migration_operations import IndexesDropConcurrently


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY

    dependencies = [
        ('wallets', '0021_lean_indexes'),
        ('webhooks', '0008_endpoint_enabled_at'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
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
            ],
            database_operations=[
                IndexesDropConcurrently(
                    indexes=[
                        ('webhooks_webhookdelivery_endpoint_id_d5bfb5c8', 'webhooks_webhookdelivery', 'endpoint_id'),
                        ('webhooks_webhookdeliveryattempt_delivery_id_4b90aed4', 'webhooks_webhookdeliveryattempt', 'delivery_id'),
                        ('webhooks_webhookendpoint_merchant_id_f9ef291a', 'webhooks_webhookendpoint', 'merchant_id'),
                    ],
                    pattern_ops_of=['webhooks_'],
                ),
            ],
        ),
    ]
