"""A failed or canceled payout's money coming back (PAYOUT_BACK) is available at once, on
the balance as on payout creation (wallets.selectors.merchant_funds_split), so both reads
of the pending window tell it from other credits:

- merchant daily totals get `returned`: of `credited`, what came back that day. Rows written
  before it get each day's returned money from the ledger, spread over the day's shard rows
  up to each row's credited (it sets, never adds). The column carries a database default: no
  table rewrite, and the code before this one keeps inserting during the deploy (a
  PAYOUT_BACK it posts then counts as pending, the safe side, until the staged migration's
  backfill rewrites that day; reconciliation names it). Its CHECK comes NOT VALID, then is
  validated without blocking postings;
- ledger transactions get a partial index of the PAYOUT_BACK ones by `created` (few rows),
  so the window's read before reads switch leaves them out without looking up each credit's
  transaction. Built CONCURRENTLY: payments keep posting meanwhile.

Not atomic (the index cannot be built in a transaction): each step is its own transaction
and runs again after a failure (a column or CHECK already there is kept; the index as
0013_payment_created_index's: an invalid one left by a failed build is dropped by hand).
Adding the column takes ACCESS EXCLUSIVE on the daily totals, which postings write: it gives
up after a short lock_timeout (run it again) rather than queue behind a long transaction."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

COLUMN = """
SET lock_timeout = '5s';
ALTER TABLE wallets_merchantdailytotal ADD COLUMN IF NOT EXISTS returned bigint DEFAULT 0 NOT NULL;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'merchantdailytotal_returned_in_credited'
                   AND conrelid = 'wallets_merchantdailytotal'::regclass) THEN
        ALTER TABLE wallets_merchantdailytotal ADD CONSTRAINT merchantdailytotal_returned_in_credited
            CHECK (returned >= 0 AND returned <= credited) NOT VALID;
    END IF;
END $$;
RESET lock_timeout;
"""
COLUMN_BACK = "ALTER TABLE wallets_merchantdailytotal DROP COLUMN IF EXISTS returned"
VALIDATE = "ALTER TABLE wallets_merchantdailytotal VALIDATE CONSTRAINT merchantdailytotal_returned_in_credited"


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

    atomic = False

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(COLUMN, reverse_sql=COLUMN_BACK)],
            state_operations=[
                migrations.AddField(
                    model_name='merchantdailytotal',
                    name='returned',
                    field=models.BigIntegerField(db_default=0, default=0),
                ),
                migrations.AddConstraint(
                    model_name='merchantdailytotal',
                    constraint=models.CheckConstraint(
                        condition=models.Q(('returned__gte', 0), ('returned__lte', models.F('credited'))),
                        name='merchantdailytotal_returned_in_credited',
                    ),
                ),
            ],
        ),
        migrations.RunSQL(VALIDATE, reverse_sql=migrations.RunSQL.noop),
        migrations.RunPython(returned_fill, migrations.RunPython.noop, atomic=True),
        AddIndexConcurrently(
            model_name='ledgertransaction',
            index=models.Index(condition=models.Q(('kind', 'payout_back')), fields=['created'], name='ledgertxn_payout_back'),
        ),
    ]
