"""Every account gets its balance rows up front (a customer's row per asset, 32 shards
per merchant and system account), as `wallets.services.ledger.balance_rows_create` now
does for new accounts: a posting then finds every row it locks in its one locking
statement, instead of making rows while earlier rows are held. Existing rows are left
as they are. Backwards: nothing to undo (empty rows are harmless to the previous code)."""

from django.db import migrations

SHARDS = 32  # wallets.models.BALANCE_SHARDS at the time of writing


def balance_rows_create(apps, schema_editor):  # type: ignore[no-untyped-def]
    Account = apps.get_model("wallets", "Account")
    Asset = apps.get_model("wallets", "Asset")
    Balance = apps.get_model("wallets", "Balance")
    codes = list(Asset.objects.values_list("code", flat=True))
    batch = []
    for account_id, kind in Account.objects.values_list("id", "kind").iterator():
        for code in codes:
            for shard in range(1 if kind == "customer" else SHARDS):
                batch.append(Balance(account_id=account_id, asset_id=code, shard=shard, may_go_negative=kind == "system"))
        if len(batch) >= 5000:
            Balance.objects.bulk_create(batch, ignore_conflicts=True)
            batch = []
    Balance.objects.bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [("wallets", "0007_carbon_impact_derived")]

    operations = [migrations.RunPython(balance_rows_create, migrations.RunPython.noop)]
