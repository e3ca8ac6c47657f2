"""A BRIN index of ledger entries by `created`, for the reads of a whole tenant's partial
day (the trial balance at an instant: daily totals up to the instant's UTC day, then the
entries of that day up to it). Entries are appended in about `created` order, so a block
range summary finds one day's blocks; it costs postings next to nothing (no btree to keep
ordered on the hot path). Built CONCURRENTLY: payments keep posting meanwhile; an index left
invalid by a failed build is dropped by hand before running again."""

from django.contrib.postgres.indexes import BrinIndex
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ('wallets', '0019_account_daily_totals'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='ledgerentry',
            index=BrinIndex(fields=['created'], name='ledgerentry_created_brin'),
        ),
    ]
