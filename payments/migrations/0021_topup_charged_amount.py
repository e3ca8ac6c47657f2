"""A top-up keeps what the PSP charged (amount, currency) when the charge is recorded, and
its card refund gives back that. Nullable / constant defaults in the database: no table
rewrite, and the code before this one keeps inserting top-ups during the deploy. Rows
recorded before it have none; their refund asks the PSP what the charge was.

Adding a column takes ACCESS EXCLUSIVE on payments_topup: queued behind a long reader it
would hold every top-up behind it, so the migration gives up after a short lock_timeout
(run it again) instead of queueing."""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    atomic = True  # SET LOCAL lasts for the migration's transaction
    dependencies = [("payments", "0020_event_sequence")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, reverse_sql=LOCK_TIMEOUT),
        migrations.AddField(model_name="topup", name="psp_charged_amount", field=models.BigIntegerField(blank=True, null=True)),
        migrations.AddField(
            model_name="topup", name="psp_charged_currency", field=models.CharField(blank=True, default="", db_default="", max_length=12)
        ),
    ]
