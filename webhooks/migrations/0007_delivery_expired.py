# A delivery whose endpoint was re-enabled after its retry window closed is `expired`
# (choices only: no change in the database).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0006_independent_deliveries"),
    ]

    operations = [
        migrations.AlterField(
            model_name="webhookdelivery",
            name="status",
            field=models.CharField(
                choices=[("pending", "Pending"), ("succeeded", "Succeeded"), ("failed", "Failed"), ("expired", "Expired")],
                default="pending", max_length=10,
            ),
        ),
    ]
