"""Payouts: the money of a payout the PSP failed after it had it is owed back through the
gateway before it returns to the merchant (`return_owed_at`, `return_failure_code`), and
the operator queue (`review_*`, resolved by two staff members: the `resolve_payout`
permission). Nullable or defaulted columns and partial indexes on rows that have none yet;
the payout guard (0026) is unchanged: no new status."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0026_payouts'),
        ('wallets', '0017_payouts'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='payout',
            options={'ordering': ['-created', '-id'], 'permissions': [('manage_payouts', "Can hold and release a merchant's payouts, and cancel a payout"), ('approve_payout', 'Can approve a payout waiting for a staff member, or retry a failed one'), ('resolve_payout', 'Can stop a payout for an operator, and resolve one in the operator queue')]},
        ),
        migrations.AddField(
            model_name='payout',
            name='return_failure_code',
            field=models.CharField(blank=True, default='', max_length=50),
        ),
        migrations.AddField(
            model_name='payout',
            name='return_owed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='payout',
            name='review_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='payout',
            name='review_maker',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember'),
        ),
        migrations.AddField(
            model_name='payout',
            name='review_outcome',
            field=models.CharField(blank=True, default='', max_length=10),
        ),
        migrations.AddField(
            model_name='payout',
            name='review_reason',
            field=models.CharField(blank=True, default='', max_length=500),
        ),
        migrations.AddField(
            model_name='payout',
            name='review_resolved_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='payout',
            name='review_resolved_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.staffmember'),
        ),
        migrations.AddIndex(
            model_name='payout',
            index=models.Index(condition=models.Q(('return_owed_at__isnull', False)), fields=['return_owed_at'], name='payout_return_owed'),
        ),
        migrations.AddIndex(
            model_name='payout',
            index=models.Index(condition=models.Q(('review_at__isnull', False)), fields=['review_at'], name='payout_in_review'),
        ),
        migrations.AddConstraint(
            model_name='payout',
            constraint=models.CheckConstraint(condition=models.Q(('review_maker__isnull', True), models.Q(('review_resolved_by', models.F('review_maker')), _negated=True), _connector='OR'), name='payout_review_checker_not_maker'),
        ),
    ]
