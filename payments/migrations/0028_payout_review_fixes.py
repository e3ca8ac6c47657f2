"""The operator queue's indexes (the recovery's returns owed, the queue itself), built
CONCURRENTLY: payouts keep being written meanwhile; then the constraints 0027 added NOT
VALID are validated, a scan under SHARE UPDATE EXCLUSIVE that lets payouts keep being
written. Each statement commits on its own; validating a valid constraint does nothing, and
an index left invalid by a failed build is dropped by hand before running again."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

CONSTRAINTS = [
    "payments_payout_review_maker_id_09ae09a9_fk_wallets_s",
    "payments_payout_review_resolved_by_i_59dfda4c_fk_wallets_s",
    "payout_review_checker_not_maker",
]


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY, and each VALIDATE in its own transaction

    dependencies = [("payments", "0027_payout_review")]

    operations = [
        AddIndexConcurrently(
            model_name="payout",
            index=models.Index(condition=models.Q(return_owed_at__isnull=False), fields=["return_owed_at"], name="payout_return_owed"),
        ),
        AddIndexConcurrently(
            model_name="payout", index=models.Index(condition=models.Q(review_at__isnull=False), fields=["review_at"], name="payout_in_review"),
        ),
        *(migrations.RunSQL(f'ALTER TABLE payments_payout VALIDATE CONSTRAINT "{name}"', reverse_sql=migrations.RunSQL.noop)
          for name in CONSTRAINTS),
    ]
