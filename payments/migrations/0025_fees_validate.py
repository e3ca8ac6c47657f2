"""Validate the fee CHECKs 0024 added NOT VALID: a scan under SHARE UPDATE EXCLUSIVE, which
lets payments and refunds keep writing. Each statement commits on its own; validating a
constraint that is already valid does nothing, so a failed run runs again."""

from django.db import migrations

CHECKS = {"payments_payment": ["payment_fee_bounded", "payment_fee_refunded_bounded"], "payments_refund": ["refund_fee_bounded"]}


class Migration(migrations.Migration):
    atomic = False  # each VALIDATE in its own transaction

    dependencies = [("payments", "0024_fees")]

    operations = [
        migrations.RunSQL(f'ALTER TABLE {table} VALIDATE CONSTRAINT "{name}"', reverse_sql=migrations.RunSQL.noop)
        for table, names in CHECKS.items()
        for name in names
    ]
