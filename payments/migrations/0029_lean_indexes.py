"""A smaller tenant: indexes that no query needs, dropped CONCURRENTLY (the tenant's
reads and writes go on; the model state changes apart, so Django does not drop and re-add
the foreign keys, which would check every row under a lock).

- The `varchar_pattern_ops` twins of the payments tables' text indexes (their prefixed ids
  and references): they serve only `LIKE 'prefix%'`, which no query here runs on them.
- Foreign keys no query looks rows up by, whose targets are never deleted (so no delete
  checks them): ledger transactions (append-only, wallets 0003), assets (wallets 0006),
  staff members (no delete path: a staff member is deactivated).
- An adjustment's staff and an intent's merchant: a composite index leads with the same
  column (adjustment_staff_asset_created, intent_merchant_created) and serves the lookups.
"""

import django.db.models.deletion
from django.db import migrations, models

from tenants.migration_operations import IndexesDropConcurrently


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY

    dependencies = [
        ('payments', '0028_payout_review_fixes'),
        ('wallets', '0021_lean_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
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
            ],
            database_operations=[
                IndexesDropConcurrently(
                    indexes=[
                        ('payments_adjustment_asset_id_fba34daf', 'payments_adjustment', 'asset_id'),
                        ('payments_adjustment_ledger_transaction_id_6eead614', 'payments_adjustment', 'ledger_transaction_id'),
                        ('payments_adjustment_staff_id_ede60248', 'payments_adjustment', 'staff_id'),
                        ('payments_merchantbankaccount_changed_by_id_485878f5', 'payments_merchantbankaccount', 'changed_by_id'),
                        ('payments_paymentintent_asset_id_7396f825', 'payments_paymentintent', 'asset_id'),
                        ('payments_paymentintent_merchant_id_9d324c66', 'payments_paymentintent', 'merchant_id'),
                        ('payments_payout_approval_maker_id_a0abf1eb', 'payments_payout', 'approval_maker_id'),
                        ('payments_payout_approved_by_id_e5a0bac0', 'payments_payout', 'approved_by_id'),
                        ('payments_payout_asset_id_b4523665', 'payments_payout', 'asset_id'),
                        ('payments_payout_ledger_transaction_id_7bddd625', 'payments_payout', 'ledger_transaction_id'),
                        ('payments_payout_paid_transaction_id_14bdfa60', 'payments_payout', 'paid_transaction_id'),
                        ('payments_payout_returned_transaction_id_b285a72e', 'payments_payout', 'returned_transaction_id'),
                        ('payments_pendingadjustment_checker_id_23eb5192', 'payments_pendingadjustment', 'checker_id'),
                        ('payments_refund_ledger_transaction_id_daf964ec', 'payments_refund', 'ledger_transaction_id'),
                        ('payments_topup_asset_id_0bc16ccb', 'payments_topup', 'asset_id'),
                        ('payments_topup_ledger_transaction_id_9e1929da', 'payments_topup', 'ledger_transaction_id'),
                        ('payments_transfer_asset_id_736faa51', 'payments_transfer', 'asset_id'),
                        ('payments_transfer_ledger_transaction_id_3b4f0f34', 'payments_transfer', 'ledger_transaction_id'),
                    ],
                    pattern_ops_of=['payments_'],
                ),
            ],
        ),
    ]
