"""The admin's payment list (newest first, date filters) reads this index instead of
sorting the table. Built CONCURRENTLY: payments keep being written meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("payments", "0012_back_office")]

    operations = [
        AddIndexConcurrently(model_name="payment", index=models.Index(fields=["-created", "-id"], name="payment_created")),
    ]
