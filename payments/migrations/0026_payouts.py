"""Payouts: a merchant's bank account held at the PSP, and the payout (payments.services.payouts).
Two new tables, and a guard on the payout's row: its status moves only forward (pending ->
in_transit -> paid, pending -> failed or canceled, in_transit or paid -> failed) and its
merchant, asset and amount never change, whatever writes the row. The function names no
schema: it is created in, and its trigger fires on, the tenant schema being migrated."""

import django.db.models.deletion
import django.utils.timezone
import payments.models
from django.db import migrations, models

GUARD = """
CREATE OR REPLACE FUNCTION tally_payout_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.merchant_id IS DISTINCT FROM OLD.merchant_id OR NEW.asset_id IS DISTINCT FROM OLD.asset_id OR NEW.amount <> OLD.amount THEN
        RAISE EXCEPTION 'payout %: its merchant, asset and amount never change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = OLD.status
       OR (OLD.status = 'pending' AND NEW.status IN ('in_transit', 'paid', 'failed', 'canceled'))
       OR (OLD.status = 'in_transit' AND NEW.status IN ('paid', 'failed'))
       OR (OLD.status = 'paid' AND NEW.status = 'failed') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'payout % cannot go from % to %', OLD.id, OLD.status, NEW.status USING ERRCODE = 'check_violation';
END;
$$;
CREATE TRIGGER payments_payout_guard BEFORE UPDATE ON payments_payout FOR EACH ROW EXECUTE FUNCTION tally_payout_guard();
"""

GUARD_REVERSE = """
DROP TRIGGER IF EXISTS payments_payout_guard ON payments_payout;
DROP FUNCTION IF EXISTS tally_payout_guard();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0025_fees_validate'),
        ('wallets', '0017_payouts'),
    ]

    operations = [
        migrations.CreateModel(
            name='MerchantBankAccount',
            fields=[
                ('merchant', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='bank_account', serialize=False, to='wallets.merchant')),
                ('gateway', models.CharField(choices=[('simulator', 'PSP simulator (development and tests)'), ('stripe', 'Stripe (production)')], max_length=20)),
                ('psp_reference', models.CharField(max_length=200)),
                ('last4', models.CharField(max_length=4)),
                ('changed_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('changed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember')),
            ],
            options={
                'permissions': [('attach_bank_account', "Can attach or change a merchant's bank account")],
            },
        ),
        migrations.CreateModel(
            name='Payout',
            fields=[
                ('id', models.CharField(default=payments.models.new_payout_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('amount', models.BigIntegerField()),
                ('status', models.CharField(choices=[('pending', 'Pending (not at the PSP yet)'), ('in_transit', 'In transit (the PSP has it)'), ('paid', 'Paid'), ('failed', 'Failed (the funds are back with the merchant)'), ('canceled', 'Canceled (the funds are back with the merchant)')], default='pending', max_length=10)),
                ('origin', models.CharField(choices=[('manual', "Manual (the merchant's request)"), ('scheduled', 'Scheduled'), ('retry', 'Retry of a failed payout (staff)')], default='manual', max_length=10)),
                ('schedule_day', models.DateField(blank=True, null=True)),
                ('gateway', models.CharField(choices=[('simulator', 'PSP simulator (development and tests)'), ('stripe', 'Stripe (production)')], max_length=20)),
                ('destination', models.CharField(max_length=200)),
                ('destination_last4', models.CharField(max_length=4)),
                ('approval_required', models.BooleanField(default=False)),
                ('approval_reason', models.CharField(blank=True, default='', max_length=200)),
                ('approved_at', models.DateTimeField(blank=True, null=True)),
                ('fence', models.PositiveIntegerField(default=0)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.CharField(blank=True, default='', max_length=500)),
                ('psp_reference', models.CharField(blank=True, default='', max_length=200)),
                ('psp_created_at', models.DateTimeField(blank=True, null=True)),
                ('arrival_expected_at', models.DateTimeField(blank=True, null=True)),
                ('psp_checked_at', models.DateTimeField(blank=True, null=True)),
                ('failure_code', models.CharField(blank=True, default='', max_length=50)),
                ('settled_at', models.DateTimeField(blank=True, null=True)),
                ('updated', models.DateTimeField(auto_now=True)),
                ('approval_maker', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember')),
                ('approved_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember')),
                ('asset', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset')),
                ('ledger_transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
                ('merchant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='payouts', to='wallets.merchant')),
                ('paid_transaction', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
                ('retry_of', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='retries', to='payments.payout')),
                ('returned_transaction', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
            ],
            options={
                'ordering': ['-created', '-id'],
                'permissions': [('manage_payouts', "Can hold and release a merchant's payouts, and cancel a payout"), ('approve_payout', 'Can approve a payout waiting for a staff member, or retry a failed one')],
                'indexes': [models.Index(fields=['-created', '-id'], name='payout_created'), models.Index(fields=['merchant', '-created', '-id'], name='payout_merchant_created'), models.Index(condition=models.Q(('status', 'pending')), fields=['created'], name='payout_pending_created'), models.Index(condition=models.Q(('status', 'in_transit')), fields=['arrival_expected_at'], name='payout_in_transit_arrival'), models.Index(condition=models.Q(('approval_maker__isnull', True), ('approved_by__isnull', False)), fields=['approved_by', 'asset', 'approved_at'], name='payout_approved_alone')],
                'constraints': [models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='payout_amount_positive'), models.CheckConstraint(condition=models.Q(('status', 'pending'), ('status', 'in_transit'), ('status', 'paid'), ('status', 'failed'), ('status', 'canceled'), _connector='OR'), name='payout_status_known'), models.CheckConstraint(condition=models.Q(models.Q(('status', 'paid'), _negated=True), ('paid_transaction__isnull', False), _connector='OR'), name='payout_paid_has_ledger'), models.CheckConstraint(condition=models.Q(models.Q(('status', 'failed'), ('status', 'canceled'), _connector='OR', _negated=True), ('returned_transaction__isnull', False), _connector='OR'), name='payout_returned_has_ledger'), models.CheckConstraint(condition=models.Q(models.Q(('status', 'in_transit'), ('status', 'paid'), _connector='OR', _negated=True), models.Q(('psp_reference', ''), _negated=True), _connector='OR'), name='payout_sent_has_reference'), models.CheckConstraint(condition=models.Q(models.Q(('status', 'canceled'), _negated=True), ('attempts', 0), _connector='OR'), name='payout_canceled_never_sent'), models.CheckConstraint(condition=models.Q(('approval_maker__isnull', True), models.Q(('approved_by', models.F('approval_maker')), _negated=True), _connector='OR'), name='payout_checker_not_maker'), models.UniqueConstraint(condition=models.Q(('schedule_day__isnull', False)), fields=('merchant', 'asset', 'schedule_day'), name='payout_scheduled_once_a_day'), models.UniqueConstraint(condition=models.Q(('psp_reference', ''), _negated=True), fields=('psp_reference',), name='payout_psp_reference_once')],
            },
        ),
        migrations.RunSQL(GUARD, GUARD_REVERSE),
    ]
