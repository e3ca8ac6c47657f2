"""What a card top-up needs to always reach a final state: `psp_charged` (the PSP holds a
successful charge, so an uncredited top-up is refunded whatever its failure code),
`operator_review_at` (past the PSP's idempotency-key window, waiting for an operator),
`last_error` (the operator's evidence), the permission to settle such a top-up, and an
index on the card refunds still owed.

The backfill marks the top-ups already known to be charged: credited ones, and failed
ones with a PSP reference whose failure came from us after the charge (cap, frozen, a
released claim). A failure code of the PSP's own (a decline) keeps its reference but no
charge. The top-up table is small (one row per card top-up): one UPDATE."""

from typing import Any

from django.db import migrations, models
from django.db.models import Q

# Failures of ours that a PSP charge can sit behind: refused credits, and a claim released
# (request_invalid) before a late answer recorded the charge.
_CHARGED_FAILURE_CODES = ("cap_exceeded", "wallet_frozen", "request_invalid")


def charged_backfill(apps: Any, schema_editor: Any) -> None:
    TopUp = apps.get_model("payments", "TopUp")
    charged = Q(status="succeeded") | Q(status="failed", failure_code__in=_CHARGED_FAILURE_CODES)
    TopUp.objects.filter(charged).exclude(psp_reference="").update(psp_charged=True)


class Migration(migrations.Migration):

    dependencies = [
        ("payments", "0016_outbox_live_unpublished_index"),
        ("wallets", "0012_staged_migrations"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="topup",
            options={"ordering": ["-created", "-id"], "permissions": [("settle_topup", "Can settle a card top-up waiting for an operator")]},
        ),
        migrations.AddField(
            model_name="topup",
            name="last_error",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
        migrations.AddField(
            model_name="topup",
            name="operator_review_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="topup",
            name="psp_charged",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(charged_backfill, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="topup",
            index=models.Index(
                condition=Q(status="failed", psp_charged=True, psp_refund_reference=""), fields=["created", "id"], name="topup_charged_uncredited"
            ),
        ),
        migrations.AddConstraint(
            model_name="topup",
            constraint=models.CheckConstraint(condition=Q(psp_charged=False) | ~Q(psp_reference=""), name="topup_charged_has_reference"),
        ),
    ]
