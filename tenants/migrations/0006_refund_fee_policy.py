"""What a refund does with the payment's fee: proportional (the default) or none."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("tenants", "0005_settlement_delay")]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="refund_fee_policy",
            field=models.CharField(
                choices=[
                    ("proportional", "Proportional (a refund gives back its share of the payment's fee)"),
                    ("none", "None (the fee is kept)"),
                ],
                db_default="proportional",
                default="proportional",
                max_length=12,
            ),
        ),
    ]
