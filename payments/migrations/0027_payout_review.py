"""Payouts: the money of a payout the PSP failed after it had it is owed back through the
gateway before it returns to the merchant (`return_owed_at`, `return_failure_code`), and
the operator queue (`review_*`, resolved by two staff members: the `resolve_payout`
permission). The payout guard (0026) is unchanged: no new status.

payments_payout takes every payout's writes, and the saga's: one ALTER TABLE adds the
columns, nullable or with a constant default kept in the database (no table rewrite; the
code before this one keeps inserting during the deploy), and the constraints NOT VALID (no
scan under the ACCESS EXCLUSIVE lock): the staff-member foreign keys and the
checker-not-maker CHECK, validated by 0028 in their own transactions, where the partial
indexes are built CONCURRENTLY too. The foreign keys have no index: only rows in the
operator queue have them, and nothing looks payouts up by them. One transaction, so a failed
run leaves nothing behind and runs again: it gives up after a short lock_timeout (SET
LOCAL, first) rather than queue every payout behind a long reader."""

import django.db.models.deletion
from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"
CHECKER_NOT_MAKER = models.Q(review_maker__isnull=True) | ~models.Q(review_resolved_by=models.F("review_maker"))

ADD = """
ALTER TABLE payments_payout
    ADD COLUMN "return_owed_at" timestamp with time zone NULL,
    ADD COLUMN "return_failure_code" varchar(50) DEFAULT '' NOT NULL,
    ADD COLUMN "review_at" timestamp with time zone NULL,
    ADD COLUMN "review_reason" varchar(500) DEFAULT '' NOT NULL,
    ADD COLUMN "review_outcome" varchar(10) DEFAULT '' NOT NULL,
    ADD COLUMN "review_maker_id" varchar(32) NULL,
    ADD COLUMN "review_resolved_by_id" varchar(32) NULL,
    ADD COLUMN "review_resolved_at" timestamp with time zone NULL,
    ADD CONSTRAINT "payments_payout_review_maker_id_09ae09a9_fk_wallets_s" FOREIGN KEY ("review_maker_id")
        REFERENCES "wallets_staffmember" ("id") DEFERRABLE INITIALLY DEFERRED NOT VALID,
    ADD CONSTRAINT "payments_payout_review_resolved_by_i_59dfda4c_fk_wallets_s" FOREIGN KEY ("review_resolved_by_id")
        REFERENCES "wallets_staffmember" ("id") DEFERRABLE INITIALLY DEFERRED NOT VALID,
    ADD CONSTRAINT "payout_review_checker_not_maker" CHECK (
        "review_maker_id" IS NULL
        OR NOT ("review_resolved_by_id" = ("review_maker_id") AND "review_resolved_by_id" IS NOT NULL AND "review_maker_id" IS NOT NULL)
    ) NOT VALID
"""

DROP = """
ALTER TABLE payments_payout
    DROP COLUMN "return_owed_at", DROP COLUMN "return_failure_code", DROP COLUMN "review_at", DROP COLUMN "review_reason",
    DROP COLUMN "review_outcome", DROP COLUMN "review_maker_id", DROP COLUMN "review_resolved_by_id", DROP COLUMN "review_resolved_at"
"""


def _staff(**extra: object) -> models.ForeignKey:  # type: ignore[type-arg]
    return models.ForeignKey(blank=True, null=True, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+',
                             to='wallets.staffmember', **extra)  # type: ignore[arg-type]


class Migration(migrations.Migration):
    atomic = True  # SET LOCAL lasts for the migration's transaction; a failed run leaves nothing (module docstring)

    dependencies = [
        ('payments', '0026_payouts'),
        ('wallets', '0017_payouts'),
    ]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, reverse_sql=LOCK_TIMEOUT),
        migrations.AlterModelOptions(
            name='payout',
            options={'ordering': ['-created', '-id'], 'permissions': [('manage_payouts', "Can hold and release a merchant's payouts, and cancel a payout"), ('approve_payout', 'Can approve a payout waiting for a staff member, or retry a failed one'), ('resolve_payout', 'Can stop a payout for an operator, and resolve one in the operator queue')]},
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(model_name='payout', name='return_owed_at', field=models.DateTimeField(blank=True, null=True)),
                migrations.AddField(model_name='payout', name='return_failure_code',
                                    field=models.CharField(blank=True, db_default='', default='', max_length=50)),
                migrations.AddField(model_name='payout', name='review_at', field=models.DateTimeField(blank=True, null=True)),
                migrations.AddField(model_name='payout', name='review_reason',
                                    field=models.CharField(blank=True, db_default='', default='', max_length=500)),
                migrations.AddField(model_name='payout', name='review_outcome',
                                    field=models.CharField(blank=True, db_default='', default='', max_length=10)),
                migrations.AddField(model_name='payout', name='review_maker', field=_staff()),
                migrations.AddField(model_name='payout', name='review_resolved_by', field=_staff()),
                migrations.AddField(model_name='payout', name='review_resolved_at', field=models.DateTimeField(blank=True, null=True)),
                migrations.AddConstraint(
                    model_name='payout', constraint=models.CheckConstraint(condition=CHECKER_NOT_MAKER, name='payout_review_checker_not_maker'),
                ),
            ],
            database_operations=[migrations.RunSQL(ADD, reverse_sql=DROP)],
        ),
    ]
