"""Balance rows carry their account's frozen flag (set by the freeze under the rows' locks),
so a posting that waited on a row while a freeze committed sees it. Rows of accounts
frozen today are marked here (frozen accounts are few: one short UPDATE)."""

from django.db import migrations, models


def frozen_rows_mark(apps, schema_editor):  # type: ignore[no-untyped-def]
    Balance = apps.get_model("wallets", "Balance")
    Balance.objects.filter(account__frozen=True).update(frozen=True)


class Migration(migrations.Migration):
    dependencies = [("wallets", "0007_carbon_impact_derived")]

    operations = [
        migrations.AddField(model_name="balance", name="frozen", field=models.BooleanField(default=False)),
        migrations.RunPython(frozen_rows_mark, migrations.RunPython.noop),
    ]
