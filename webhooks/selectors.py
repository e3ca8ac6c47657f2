"""Reads of merchant webhook endpoints, always scoped to the merchant."""

from __future__ import annotations

from django.db.models import QuerySet

from wallets.errors import NotFound
from webhooks.models import WebhookEndpoint


def webhook_endpoint_list(*, merchant_id: str) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(merchant_id=merchant_id)


def webhook_endpoint_get(*, merchant_id: str, endpoint_id: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(merchant_id=merchant_id, pk=endpoint_id).first()
    if endpoint is None:  # unknown, or another merchant's: the same answer
        raise NotFound("no such webhook endpoint")
    return endpoint
