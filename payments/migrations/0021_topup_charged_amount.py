"""A top-up keeps what the PSP charged (amount, currency) when the charge is recorded, and
its card refund gives back that. Nullable / constant defaults in the database: no table
rewrite, and the code before this one keeps inserting top-ups during the deploy. Rows
recorded before it have none; their refund falls back to the top-up's amount (the only
charges recorded on them matched it)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("payments", "0020_event_sequence")]

    operations = [
        migrations.AddField(model_name="topup", name="psp_charged_amount", field=models.BigIntegerField(blank=True, null=True)),
        migrations.AddField(
            model_name="topup", name="psp_charged_currency", field=models.CharField(blank=True, default="", db_default="", max_length=10)
        ),
    ]
