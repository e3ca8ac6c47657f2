"""Deliveries stand alone: a claim leases a delivery (`leased_until`) instead of an
endpoint's dispatch lock sending them in event order; an endpoint may cap its requests in
flight (`max_concurrency`). The claim reads an endpoint's due deliveries by due time, its
leased ones to count what is in flight, and its delivered ones to tell whether anything
got through lately; the event-order index goes. Indexes are built CONCURRENTLY before the
old one is dropped: the relay keeps making deliveries meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("payments", "0020_event_sequence"),
        ("webhooks", "0005_admin_names"),
    ]

    operations = [
        migrations.AddField(model_name="webhookdelivery", name="leased_until", field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="webhookendpoint", name="max_concurrency", field=models.PositiveSmallIntegerField(blank=True, null=True)),
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(fields=["endpoint", "next_attempt_at"], condition=models.Q(status="pending"), name="webhookdelivery_endpoint_due"),
        ),
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(
                fields=["endpoint", "leased_until"], condition=models.Q(status="pending", leased_until__isnull=False),
                name="webhookdelivery_leased",
            ),
        ),
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(fields=["endpoint", "delivered_at"], condition=models.Q(status="succeeded"), name="webhookdelivery_delivered"),
        ),
        RemoveIndexConcurrently(model_name="webhookdelivery", name="webhookdelivery_pending"),
    ]
