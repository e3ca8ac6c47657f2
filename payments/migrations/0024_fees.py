"""Fee schedules, and the fee on payments and refunds.

payments_payment and payments_refund are the hottest tables: their new columns have
constant defaults in the database (no table rewrite; the code before this one keeps
inserting during the deploy), and the CHECKs are added NOT VALID (no scan under the ACCESS
EXCLUSIVE lock); 0025 validates them, in its own transactions, while payments keep writing.
Rows from before hold fee 0, which the CHECKs accept.

One transaction, so a failed run leaves nothing behind and runs again: it gives up after a
short lock_timeout (SET LOCAL, first) rather than queue every payment behind a long
reader. The ALTERs come last, so the tables' locks are held only for the commit."""

import django.db.models.deletion
from django.db import migrations, models

import payments.models

CHECKS = {
    "payments_payment": {
        "payment_fee_bounded": ('"fee" >= 0 AND "fee" <= ("amount")', models.Q(fee__gte=0, fee__lte=models.F("amount"))),
        "payment_fee_refunded_bounded": (
            '"fee_refunded" >= 0 AND "fee_refunded" <= ("fee")', models.Q(fee_refunded__gte=0, fee_refunded__lte=models.F("fee"))
        ),
    },
    "payments_refund": {"refund_fee_bounded": ('"fee" >= 0 AND "fee" <= ("amount")', models.Q(fee__gte=0, fee__lte=models.F("amount")))},
}
COLUMNS = {"payments_payment": ["fee", "fee_refunded"], "payments_refund": ["fee"]}


def _add(table: str) -> str:
    parts = [f'ADD COLUMN "{column}" bigint DEFAULT 0 NOT NULL' for column in COLUMNS[table]]
    parts += [f'ADD CONSTRAINT "{name}" CHECK ({sql}) NOT VALID' for name, (sql, _) in CHECKS[table].items()]
    return f"ALTER TABLE {table} {', '.join(parts)}"


def _drop(table: str) -> str:
    return f"ALTER TABLE {table} " + ", ".join(f'DROP COLUMN "{column}"' for column in COLUMNS[table])


LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    atomic = True  # SET LOCAL lasts for the migration's transaction; a failed run leaves nothing (module docstring)

    dependencies = [
        ("payments", "0023_adjustment_staff_asset_created_index"),
        ("wallets", "0015_staff_login_deactivation_revokes_keys"),
    ]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, reverse_sql=LOCK_TIMEOUT),
        migrations.CreateModel(
            name="FeeSchedule",
            fields=[
                ("id", models.CharField(default=payments.models.new_fee_schedule_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ("created", models.DateTimeField(auto_now_add=True)),
                ("rate", models.DecimalField(decimal_places=6, max_digits=7)),
                ("rounding", models.CharField(
                    choices=[
                        ("ROUND_HALF_EVEN", "Half to even (banker's)"), ("ROUND_HALF_UP", "Half up"), ("ROUND_HALF_DOWN", "Half down"),
                        ("ROUND_UP", "Away from zero"), ("ROUND_DOWN", "Toward zero"), ("ROUND_CEILING", "Ceiling"), ("ROUND_FLOOR", "Floor"),
                    ],
                    default="ROUND_HALF_EVEN",
                    max_length=16,
                )),
                ("fixed", models.BigIntegerField(default=0)),
                ("valid_from", models.DateTimeField()),
                ("asset", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="wallets.asset")),
                ("merchant", models.ForeignKey(
                    blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="fee_schedules", to="wallets.merchant"
                )),
            ],
            options={
                "ordering": ["-valid_from", "-id"],
                "constraints": [
                    models.CheckConstraint(condition=models.Q(rate__gte=0, rate__lte=1), name="fee_schedule_rate_bounded"),
                    models.CheckConstraint(condition=models.Q(fixed__gte=0), name="fee_schedule_fixed_non_negative"),
                    models.UniqueConstraint(fields=("asset", "merchant", "valid_from"), name="fee_schedule_one_start", nulls_distinct=False),
                ],
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(model_name="payment", name="fee", field=models.BigIntegerField(db_default=0, default=0)),
                migrations.AddField(model_name="payment", name="fee_refunded", field=models.BigIntegerField(db_default=0, default=0)),
                migrations.AddField(model_name="refund", name="fee", field=models.BigIntegerField(db_default=0, default=0)),
                *(
                    migrations.AddConstraint(model_name=table.removeprefix("payments_"), constraint=models.CheckConstraint(condition=q, name=name))
                    for table, checks in CHECKS.items()
                    for name, (_, q) in checks.items()
                ),
            ],
            database_operations=[
                migrations.RunSQL([_add(table) for table in CHECKS], reverse_sql=[_drop(table) for table in CHECKS]),
            ],
        ),
    ]
