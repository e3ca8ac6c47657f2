"""A smaller tenant: a finding's run needs no index of its own; reconfinding_run_kind
leads with it and serves the lookups (and the cascade from a deleted run)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reconciliation', '0002_books'),
    ]

    operations = [
        migrations.AlterField(
            model_name='reconciliationfinding',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='findings', to='reconciliation.reconciliationrun'),
        ),
    ]
