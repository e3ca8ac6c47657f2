"""Payouts: assets a tenant pays merchants out in (its main currency is marked payable here,
as new tenants get it), the payout approval threshold, each merchant's schedule and hold,
and the system account of payouts in transit with its balance rows (in every bootstrapped
tenant; new tenants get it from wallets.services.ledger.tenant_ledger_bootstrap). The PSP
funding account becomes the tenant's PSP settlement position (a label: paid payouts go to it).

New columns are nullable or carry a database default: no table rewrite, and the code before
this one keeps inserting during the deploy. Adding a column takes ACCESS EXCLUSIVE on
wallets_asset and wallets_merchant, which every payment reads: the migration gives up after
a short lock_timeout (run it again) rather than queue behind a long reader."""

import django.core.validators
from django.db import migrations, models

from wallets import ids

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"
SHARDS = 32  # wallets.models.BALANCE_SHARDS when this was written


def payouts_account_create(apps, schema_editor):  # type: ignore[no-untyped-def]
    Account = apps.get_model("wallets", "Account")
    Asset = apps.get_model("wallets", "Asset")
    Balance = apps.get_model("wallets", "Balance")
    if not Account.objects.filter(kind="system").exists():
        return  # not bootstrapped (the template): tenant_ledger_bootstrap makes it
    Asset.objects.filter(is_main=True).update(payable=True)
    account = Account.objects.filter(system_role="payouts_in_transit").first()
    if account is None:
        account = Account.objects.create(id=ids.new_account_id(), kind="system", system_role="payouts_in_transit")
    Balance.objects.bulk_create(
        [Balance(account=account, asset_id=code, shard=shard, may_go_negative=True) for code in Asset.objects.values_list("code", flat=True)
         for shard in range(SHARDS)],
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):

    dependencies = [
        ('wallets', '0016_settlement_delay'),
    ]

    atomic = True  # SET LOCAL lasts for the migration's transaction

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, reverse_sql=LOCK_TIMEOUT),
        migrations.AddField(
            model_name='asset',
            name='payable',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='asset',
            name='payout_approval_threshold',
            field=models.BigIntegerField(blank=True, null=True, validators=[django.core.validators.MinValueValidator(0)]),
        ),
        migrations.AddField(
            model_name='merchant',
            name='payout_schedule',
            field=models.CharField(choices=[('daily', 'Daily'), ('weekly', 'Weekly (on its weekday)'), ('manual', 'Manual (POST /v1/merchant/payouts)')], db_default='manual', default='manual', max_length=8),
        ),
        migrations.AddField(
            model_name='merchant',
            name='payout_weekday',
            field=models.PositiveSmallIntegerField(blank=True, null=True, validators=[django.core.validators.MaxValueValidator(6)]),
        ),
        migrations.AddField(
            model_name='merchant',
            name='payouts_held',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='merchant',
            name='payouts_held_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='merchant',
            name='payouts_held_reason',
            field=models.CharField(blank=True, db_default='', default='', max_length=500),
        ),
        migrations.AlterField(
            model_name='account',
            name='system_role',
            field=models.CharField(blank=True, choices=[('psp_funding', 'PSP settlement (card top-ups in, payouts out)'), ('bonus_pool', 'Bonus pool (top-up bonuses, points issuance)'), ('fees', 'Fees'), ('carbon_registry', 'Carbon registry'), ('adjustments', 'Staff adjustments'), ('payouts_in_transit', 'Payouts in transit (left the merchant, not yet paid)')], max_length=20, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name='ledgertransaction',
            name='kind',
            field=models.CharField(choices=[('payment', 'Payment'), ('refund', 'Refund'), ('transfer', 'Transfer'), ('topup', 'Top-up'), ('adjustment', 'Adjustment'), ('capture', 'Intent capture'), ('payout', 'Payout (merchant to in transit)'), ('payout_paid', 'Payout paid (in transit to the PSP)'), ('payout_back', 'Payout failed or canceled (back to the merchant)')], max_length=12),
        ),
        migrations.AddConstraint(
            model_name='asset',
            constraint=models.CheckConstraint(condition=models.Q(('payable', False), ('kind', 'currency'), ('kind', 'regional'), _connector='OR'), name='asset_payable_is_money'),
        ),
        migrations.AddConstraint(
            model_name='merchant',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('payout_schedule', 'weekly'), ('payout_weekday__isnull', False), ('payout_weekday__lte', 6)), models.Q(models.Q(('payout_schedule', 'weekly'), _negated=True), ('payout_weekday__isnull', True)), _connector='OR'), name='merchant_weekly_payouts_have_a_weekday'),
        ),
        migrations.RunPython(payouts_account_create, migrations.RunPython.noop),
    ]
