"""Merchant webhook endpoints, and the deliveries the outbox relay makes to them (SPEC 8).

A foreign key has no index of its own (db_index=False) where no query looks rows up by it
and nothing deletes its target, or where a composite index leads with it: each index is a
relation in every tenant (the budget in tests/test_tenant_schemas.py)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from payments.models import OutboxEvent
from wallets import ids
from wallets.abstract import PrefixedIdModel
from wallets.models import Merchant


def new_webhook_delivery_id() -> str:
    return ids.new_id("whd")


class WebhookEndpointStatus(models.TextChoices):
    ENABLED = "enabled", "Enabled"
    DISABLED = "disabled", "Disabled"


class WebhookEndpoint(PrefixedIdModel, new_id=ids.new_webhook_endpoint_id):
    """Where a merchant wants its events POSTed, signed with its secret (SPEC 8). After a
    rotation the previous secret also signs until `previous_secret_expires_at`. Only
    webhooks.secrets reads or writes the four secret fields (sealed)."""

    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="webhook_endpoints", db_index=False)
    url = models.URLField(max_length=2048)
    description = models.CharField(max_length=200, blank=True, default="")
    # Event topics to deliver ("payment.succeeded", ...); ["*"] for all.
    enabled_events = models.JSONField(default=list)
    status = models.CharField(max_length=10, choices=WebhookEndpointStatus.choices, default=WebhookEndpointStatus.ENABLED)
    secret_plaintext = models.CharField(max_length=80, blank=True, default="", db_column="secret", editable=False)
    previous_secret_plaintext = models.CharField(max_length=80, blank=True, default="", db_column="previous_secret", editable=False)
    # NULL: not sealed yet (webhooks.secrets).
    secret_sealed = models.BinaryField(null=True, blank=True, editable=False)
    previous_secret_sealed = models.BinaryField(null=True, blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # Why the endpoint was disabled, shown to the merchant ("" when enabled, or disabled by hand).
    disabled_reason = models.CharField(max_length=500, blank=True, default="")
    # Requests in flight at once across every worker (null: TALLY_WEBHOOK_ENDPOINT_CONCURRENCY).
    max_concurrency = models.PositiveSmallIntegerField(null=True, blank=True)
    # When it was registered or last enabled again (null: before this was kept; read as
    # `created`). Not disabled for failing within the retry window after it.
    enabled_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created", "-id"]
        permissions = [("manage_webhookendpoint", "Can enable and disable a webhook endpoint")]
        indexes = [models.Index(fields=["merchant", "-created", "-id"], name="webhookendpoint_merchant")]

    def __str__(self) -> str:
        return f"{self.id} {self.url} ({self.status})"


class WebhookDeliveryStatus(models.TextChoices):
    # Due at next_attempt_at; while its endpoint is disabled it waits (docs/WEBHOOKS.md "No event dropped").
    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"  # the endpoint answered 2xx
    FAILED = "failed", "Failed"  # retried for the whole window without a 2xx; redeliverable
    # Its retry window closed while its endpoint was disabled (the sweep, or a claim, marks it); redeliverable.
    EXPIRED = "expired", "Expired"


class WebhookDelivery(PrefixedIdModel, new_id=new_webhook_delivery_id):
    """One event for one endpoint, sent until a 2xx answers or the retry window closes,
    and redeliverable after. A claim sets `leased_until` and `next_attempt_at` to the same
    moment: no other worker claims it meanwhile, and it is due again if the worker dies."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries", db_index=False)
    event = models.ForeignKey(OutboxEvent, on_delete=models.PROTECT, related_name="+")
    topic = models.CharField(max_length=100)
    event_created = models.DateTimeField()  # the event's `created` (lag measurements, admin)
    status = models.CharField(max_length=10, choices=WebhookDeliveryStatus.choices, default=WebhookDeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    give_up_at = models.DateTimeField()  # retries stop here (3 days after creation or redelivery)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The claim's lease while a worker sends it, and the fence its record checks (null otherwise).
    leased_until = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"
        ordering = ["-created", "-id"]
        permissions = [("redeliver_webhookdelivery", "Can redeliver a webhook delivery")]
        constraints = [models.UniqueConstraint(fields=["endpoint", "event"], name="webhookdelivery_once_per_endpoint")]
        indexes = [
            models.Index(fields=["endpoint", "-created", "-id"], name="webhookdelivery_endpoint"),
            # An endpoint's due deliveries, oldest due first (the claim).
            models.Index(fields=["endpoint", "next_attempt_at"], condition=Q(status="pending"), name="webhookdelivery_endpoint_due"),
            models.Index(fields=["next_attempt_at"], condition=Q(status="pending"), name="webhookdelivery_due"),
            # An endpoint's requests in flight (the per-endpoint cap), without reading its backlog.
            models.Index(
                fields=["endpoint", "leased_until"], condition=Q(status="pending", leased_until__isnull=False),
                name="webhookdelivery_leased",
            ),
            # Pending rows whose window closed (the expiry sweep, webhook_waiting_deliveries_expire).
            models.Index(fields=["give_up_at"], condition=Q(status="pending"), name="webhookdelivery_give_up"),
            # Whether anything got through lately (an endpoint is disabled only when nothing has).
            models.Index(fields=["endpoint", "delivered_at"], condition=Q(status="succeeded"), name="webhookdelivery_delivered"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.topic} -> {self.endpoint_id} ({self.status})"


class WebhookDeliveryAttempt(models.Model):
    """One POST of a delivery: what came back, how fast, and why it failed."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.PROTECT, related_name="attempt_log", db_index=False)
    attempted_at = models.DateTimeField(default=timezone.now)
    succeeded = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)  # null: no HTTP answer
    latency_ms = models.PositiveIntegerField()
    address = models.CharField(max_length=64, blank=True, default="")  # the IP connected to (after the SSRF check)
    response_excerpt = models.CharField(max_length=500, blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-attempted_at", "-id"]
        indexes = [models.Index(fields=["delivery", "-attempted_at"], name="webhookattempt_delivery")]

    def __str__(self) -> str:
        return f"{self.delivery_id} {self.status_code or self.error}"
