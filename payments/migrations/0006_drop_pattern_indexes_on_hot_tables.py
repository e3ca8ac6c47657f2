"""Drop the `*_like` (varchar_pattern_ops) indexes Django adds to char primary keys and
indexed char columns of the tables every payment inserts into. Ids are only ever looked up
by equality, so these indexes serve no query and cost one index insertion each per payment.
"""

from typing import Any

from django.db import migrations

HOT_COLUMNS = [
    ("payments_payment", "id"),
    ("payments_outboxevent", "id"),
    ("wallets_ledgertransaction", "id"),
    ("wallets_ledgerentry", "transaction_id"),
]


def drop_like_indexes(apps: Any, schema_editor: Any) -> None:
    for table, column in HOT_COLUMNS:
        name = schema_editor._create_index_name(table, [column], suffix="_like")
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):
    dependencies = [("payments", "0005_payment_no_hot_fks"), ("wallets", "0005_ledger_no_hot_fks")]

    operations = [migrations.RunPython(drop_like_indexes, migrations.RunPython.noop)]
