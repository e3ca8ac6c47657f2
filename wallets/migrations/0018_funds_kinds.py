"""Merchant daily totals tell payout money coming back from other credits: `returned`, of
`credited`, what failed or canceled payouts (PAYOUT_BACK) brought back that day. It was
available when it left, so the pending split reads credited - returned
(wallets.selectors.merchant_funds_of), as payout creation always did.

The column carries a database default: no table rewrite, and the code before this one keeps
inserting during the deploy (a PAYOUT_BACK it posts then is left counted as pending, the
safe side, until the staged migration's backfill rewrites that day; reconciliation names
it). Rows written before it get each day's returned money from the ledger, spread over the
day's shard rows up to each row's credited: re-runnable, it sets and never adds."""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


def returned_fill(apps, schema_editor):  # type: ignore[no-untyped-def]
    MerchantDailyTotal = apps.get_model("wallets", "MerchantDailyTotal")
    if not MerchantDailyTotal.objects.exists():
        return  # the tenant never wrote daily totals: nothing to correct
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.account_id, e.asset_id, (e.created AT TIME ZONE 'UTC')::date, SUM(e.amount)
              FROM wallets_ledgerentry e
              JOIN wallets_ledgertransaction t ON t.id = e.transaction_id
              JOIN wallets_account a ON a.id = e.account_id
             WHERE t.kind = 'payout_back' AND e.amount > 0 AND a.kind = 'merchant'
             GROUP BY 1, 2, 3
            """
        )
        days = cursor.fetchall()
    for account_id, asset_id, day, total in days:
        left = int(total)
        for row in MerchantDailyTotal.objects.filter(account_id=account_id, asset_id=asset_id, day=day).order_by("shard"):
            take = min(left, row.credited)
            MerchantDailyTotal.objects.filter(pk=row.pk).update(returned=take)
            left -= take


class Migration(migrations.Migration):

    dependencies = [
        ('wallets', '0017_payouts'),
    ]

    atomic = True  # SET LOCAL lasts for the migration's transaction

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, reverse_sql=LOCK_TIMEOUT),
        migrations.AddField(
            model_name='merchantdailytotal',
            name='returned',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddConstraint(
            model_name='merchantdailytotal',
            constraint=models.CheckConstraint(
                condition=models.Q(('returned__gte', 0), ('returned__lte', models.F('credited'))), name='merchantdailytotal_returned_in_credited'
            ),
        ),
        migrations.RunPython(returned_fill, migrations.RunPython.noop),
    ]
