"""The carbon aggregate is derived from the payments (each keeps the grams it earned and
what refunds took back; payments.selectors.carbon_impact_grams sums them), so the
sharded `CarbonImpact` rows every payment upserted go: two writes and two row locks less
per rewarded payment, and one copy of the carbon rule instead of two.

Backwards: the table comes back filled from the payments, as the previous code expects
(one row per account, shard 0)."""

from django.db import migrations, models
from django.db.models import F, Sum


def carbon_impacts_backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    Account = apps.get_model("wallets", "Account")
    CarbonImpact = apps.get_model("wallets", "CarbonImpact")
    Payment = apps.get_model("payments", "Payment")
    net = Sum(F("carbon_grams") - F("carbon_grams_reversed"))
    rows = []
    for party_field in ("customer_id", "merchant_id"):
        for party_id, grams in Payment.objects.values_list(party_field).annotate(grams=net).values_list(party_field, "grams"):
            account = Account.objects.filter(**{party_field: party_id}).first()
            if account is not None and grams:
                rows.append(CarbonImpact(account=account, shard=0, grams=grams))
    CarbonImpact.objects.bulk_create(rows)


class Migration(migrations.Migration):
    dependencies = [
        ("wallets", "0006_reference_targets_undeletable"),
        ("payments", "0001_squashed_0009_drop_payment_function"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, carbon_impacts_backfill),
        migrations.DeleteModel(name="CarbonImpact"),
    ]
