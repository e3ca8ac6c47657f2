"""A smaller tenant: a finding's run needs no index of its own; reconfinding_run_kind
leads with it and serves the lookups (and the cascade from a deleted run). Dropped
CONCURRENTLY, with the model state changed apart (so Django does not re-add the foreign key)."""

import django.db.models.deletion
from django.db import migrations, models

from tenants.migration_operations import IndexesDropConcurrently


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY

    dependencies = [
        ('reconciliation', '0002_books'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='reconciliationfinding',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='findings', to='reconciliation.reconciliationrun'),
                ),
            ],
            database_operations=[
                IndexesDropConcurrently(
                    indexes=[
                        ('reconciliation_reconciliationfinding_run_id_9ca80db1', 'reconciliation_reconciliationfinding', 'run_id'),
                    ],
                    pattern_ops_of=[],
                ),
            ],
        ),
    ]
