# The maker-checker's sum of one staff member's solo postings in one asset within the
# window (payments.selectors.staff_solo_postings_total). An index only, built
# CONCURRENTLY: adjustments keep being posted while it builds. Not partial: whether an
# adjustment was posted alone is a join (PendingAdjustment.adjustment), not a column.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("payments", "0022_outbox_merchant_created_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="adjustment",
            index=models.Index(fields=["staff", "asset", "created"], name="adjustment_staff_asset_created"),
        ),
    ]
