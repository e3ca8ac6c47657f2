"""Checks on the webhooks app's data, and the per-run metrics of the deliveries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count

from reconciliation.checks.base import CheckContext, Discrepancy, ObjectRef, Severity
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus


def webhook_dead_letters_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Webhook deliveries failed or expired: never delivered, redeliverable from the admin."""
    dead = WebhookDelivery.objects.filter(status__in=[WebhookDeliveryStatus.FAILED, WebhookDeliveryStatus.EXPIRED])
    for delivery in dead.select_related("endpoint").order_by("created", "id").iterator(chunk_size=ctx.chunk_size):
        how = "failed" if delivery.status == WebhookDeliveryStatus.FAILED else "expired"
        yield Discrepancy(
            kind="webhook_dead_letter" if how == "failed" else "webhook_expired",
            severity=Severity.WARNING,
            summary=f"delivery {delivery.id} of {delivery.event_id} ({delivery.topic}) to {delivery.endpoint.url} {how} after "
            f"{delivery.attempts} attempts: {delivery.last_status_code or delivery.last_error[:120]}",
            details={"delivery": delivery.id, "event": delivery.event_id, "topic": delivery.topic, "endpoint": delivery.endpoint_id,
                     "merchant": delivery.endpoint.merchant_id, "url": delivery.endpoint.url, "attempts": delivery.attempts,
                     "last_status_code": delivery.last_status_code, "last_error": delivery.last_error,
                     "give_up_at": delivery.give_up_at.isoformat()},
            refs=(ObjectRef("webhooks", "webhookdelivery", delivery.id), ObjectRef("webhooks", "webhookendpoint", delivery.endpoint_id),
                  ObjectRef("payments", "outboxevent", delivery.event_id)),
        )


def webhooks_run_metrics(*, ctx: CheckContext) -> dict[str, Any]:
    counts = dict(WebhookDelivery.objects.order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    return {f"webhook_{status}": int(counts.get(status, 0)) for status in ("pending", "failed", "expired")}
