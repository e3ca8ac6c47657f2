"""The back office's refund list (newest first) reads this index instead of sorting the
table. Built CONCURRENTLY."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("payments", "0013_payment_created_index")]

    operations = [
        AddIndexConcurrently(model_name="refund", index=models.Index(fields=["-created", "-id"], name="refund_created")),
    ]
