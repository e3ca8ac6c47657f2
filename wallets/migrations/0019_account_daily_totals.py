"""Daily totals for every account: the model that held merchants' days becomes
AccountDailyTotal, which also holds customers' and system accounts' (written once the staged
migration `account_daily_totals` expands). State only: the table keeps its name, its
columns and its constraints, so the code still running during a deploy keeps writing it."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('wallets', '0018_funds_kinds'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RenameModel(old_name='MerchantDailyTotal', new_name='AccountDailyTotal'),
                migrations.AlterModelTable(name='accountdailytotal', table='wallets_merchantdailytotal'),
            ],
        ),
    ]
