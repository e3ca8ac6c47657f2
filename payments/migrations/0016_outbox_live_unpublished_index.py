"""The relay's reads of the oldest live unpublished events (claim, delivery watermark, lag
gauge) get an index whose predicate matches them, so they stop at the first row instead of
visiting every dead entry until VACUUM; dead letters get their own, nearly empty, index.
Built CONCURRENTLY before the old index is dropped: payments keep writing events meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("payments", "0015_card_topups")]

    operations = [
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(
                fields=["created", "id"], condition=models.Q(published_at__isnull=True, dead_at__isnull=True), name="outbox_live_unpublished"
            ),
        ),
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(
                fields=["dead_at", "id"], condition=models.Q(published_at__isnull=True, dead_at__isnull=False), name="outbox_dead_letters"
            ),
        ),
        RemoveIndexConcurrently(model_name="outboxevent", name="outbox_unpublished"),
    ]
