"""The tenant's time zone: where its days and months begin (statements, month-end report,
daily figures). A column default, so tenants inserted by code before it still get UTC."""

from django.db import migrations, models

import tenants.models


class Migration(migrations.Migration):

    dependencies = [("tenants", "0006_refund_fee_policy")]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="time_zone",
            field=models.CharField(
                db_default="UTC", default="UTC", max_length=64, validators=[tenants.models.time_zone_validate],
                help_text="IANA time zone name, e.g. Europe/Berlin or Asia/Tokyo: where the tenant's days and months begin.",
            ),
        ),
    ]
