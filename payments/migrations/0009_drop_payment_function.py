"""The payment path moves into Python (payments/services/charges.py): drop the PL/pgSQL
functions that held it. No business rule is left in SQL; the triggers that stay are
guards only (append-only ledger, undeletable references).

Backwards: recreate the functions as 0007 left them, so that rolling a release back
leaves the previous code a working payment path."""

from importlib import import_module

from django.db import migrations

FORWARD = """
DROP FUNCTION IF EXISTS tally_payment_create(text, text, text, text, text, text, text, bigint, bigint, bigint, text, text, integer, timestamptz);
DROP FUNCTION IF EXISTS tally_customer_reward_credit(text, text, bigint, bigint);
"""

BACKWARD = (
    import_module("payments.migrations.0002_payment_hot_path").FORWARD
    + import_module("payments.migrations.0007_payment_hot_path_caller_clock").FORWARD
)


class Migration(migrations.Migration):
    dependencies = [("payments", "0008_payment_token_single_use")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD, elidable=True)]
