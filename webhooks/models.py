"""Merchant webhook endpoints (deliveries come with the outbox relay)."""

from __future__ import annotations

from django.db import models

from wallets import ids
from wallets.models import Merchant


class WebhookEndpointStatus(models.TextChoices):
    ENABLED = "enabled", "Enabled"
    DISABLED = "disabled", "Disabled"


class WebhookEndpoint(models.Model):
    """Where a merchant wants its events POSTed, signed with `secret` (SPEC 8).

    The secret signs deliveries (HMAC-SHA256), so it must be usable, not just
    verifiable: it is stored as is, and the API shows it only in the responses that
    create or rotate it. After a rotation the previous secret still signs (a second `v1=`
    in the signature header) until `previous_secret_expires_at`, so the merchant can
    deploy the new one without dropping events.
    """

    id = models.CharField(max_length=ids.ID_MAX_LENGTH, primary_key=True, default=ids.new_webhook_endpoint_id, editable=False)
    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="webhook_endpoints")
    url = models.URLField(max_length=2048)
    description = models.CharField(max_length=200, blank=True, default="")
    # Event topics to deliver ("payment.succeeded", ...); ["*"] for all.
    enabled_events = models.JSONField(default=list)
    status = models.CharField(max_length=10, choices=WebhookEndpointStatus.choices, default=WebhookEndpointStatus.ENABLED)
    secret = models.CharField(max_length=80)
    previous_secret = models.CharField(max_length=80, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["merchant", "-created", "-id"], name="webhookendpoint_merchant")]

    def __str__(self) -> str:
        return f"{self.id} {self.url} ({self.status})"
