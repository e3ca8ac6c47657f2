"""A smaller tenant: indexes that no query needs.

- The `varchar_pattern_ops` twins of the payments tables' text indexes (their prefixed ids
  and references): they serve only `LIKE 'prefix%'`, which no query here runs on them.
- Foreign keys no query looks rows up by, whose targets are never deleted (so no delete
  checks them): ledger transactions (append-only, wallets 0003), assets and merchants
  (wallets 0006), staff members (no delete path: a staff member is deactivated).
- An adjustment's staff and an intent's merchant: a composite index leads with the same
  column (adjustment_staff_asset_created, intent_merchant_created) and serves the lookups.
"""

import django.db.models.deletion
from django.db import migrations, models

from tenants.schemas import indexes_drop_sql


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0028_payout_review_fixes'),
        ('wallets', '0021_lean_indexes'),
    ]

    operations = [
        migrations.RunSQL(indexes_drop_sql(table_prefixes=['payments_']), reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='adjustment',
            name='asset',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
        ),
        migrations.AlterField(
            model_name='adjustment',
            name='ledger_transaction',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='adjustment',
            name='staff',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='adjustments', to='wallets.staffmember'),
        ),
        migrations.AlterField(
            model_name='merchantbankaccount',
            name='changed_by',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember'),
        ),
        migrations.AlterField(
            model_name='paymentintent',
            name='asset',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
        ),
        migrations.AlterField(
            model_name='paymentintent',
            name='merchant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='payment_intents', to='wallets.merchant'),
        ),
        migrations.AlterField(
            model_name='payout',
            name='approval_maker',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember'),
        ),
        migrations.AlterField(
            model_name='payout',
            name='approved_by',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember'),
        ),
        migrations.AlterField(
            model_name='payout',
            name='asset',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
        ),
        migrations.AlterField(
            model_name='payout',
            name='ledger_transaction',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='payout',
            name='paid_transaction',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='payout',
            name='returned_transaction',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='pendingadjustment',
            name='checker',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='adjustments_checked', to='wallets.staffmember'),
        ),
        migrations.AlterField(
            model_name='pendingadjustment',
            name='merchant',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.merchant'),
        ),
        migrations.AlterField(
            model_name='refund',
            name='ledger_transaction',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='topup',
            name='asset',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
        ),
        migrations.AlterField(
            model_name='topup',
            name='ledger_transaction',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='transfer',
            name='asset',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
        ),
        migrations.AlterField(
            model_name='transfer',
            name='ledger_transaction',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
    ]
