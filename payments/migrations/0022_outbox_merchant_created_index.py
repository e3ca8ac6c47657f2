# A merchant's events, newest first (GET /v1/merchant/events). An index only, built
# CONCURRENTLY: the outbox takes every payment's insert while it builds.

import django.db.models.fields.json
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("payments", "0021_topup_charged_amount"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(
                django.db.models.fields.json.KeyTextTransform("merchant", "payload"),
                models.OrderBy(models.F("created"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                name="outbox_merchant_created",
            ),
        ),
    ]
