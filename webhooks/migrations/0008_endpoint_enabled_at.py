# An endpoint's `enabled_at` (nullable, no backfill: null reads as `created`), and the
# partial index the expiry sweep reads (pending deliveries by `give_up_at`), built
# concurrently: the deliveries table is large and written all the time.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("webhooks", "0007_delivery_expired"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookendpoint",
            name="enabled_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(condition=models.Q(("status", "pending")), fields=["give_up_at"], name="webhookdelivery_give_up"),
        ),
    ]
