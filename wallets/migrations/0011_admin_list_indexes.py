"""Indexes for the back office's list order (newest or oldest first by `created`) on
tables that grow with the customers: without them a list of a million rows sorts the
table. Built CONCURRENTLY: writes continue meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("wallets", "0010_audit_append_only")]

    operations = [
        AddIndexConcurrently(model_name="account", index=models.Index(fields=["created", "id"], name="account_created")),
        AddIndexConcurrently(model_name="apikey", index=models.Index(fields=["created", "id"], name="apikey_created")),
        AddIndexConcurrently(model_name="customer", index=models.Index(fields=["created", "id"], name="customer_created")),
    ]
