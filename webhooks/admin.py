"""The outbox and merchant webhooks in the tenant admin (SPEC 8-9): read-only rows; staff
act through the API's services, audited (payments/admin_actions.py). Secrets never show."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from idempotency.admin import StaffActionForm
from payments.admin_actions import StaffAction, StaffActionsMixin
from payments.models import OutboxEvent
from wallets.adminkit import ReadOnlyAdmin, ReadOnlyMixin, link_column
from webhooks.models import WebhookDelivery, WebhookDeliveryAttempt, WebhookEndpoint, WebhookEndpointStatus
from webhooks.services.deliveries import webhook_delivery_redeliver
from webhooks.services.endpoints import MAX_ENDPOINT_CONCURRENCY, webhook_endpoint_concurrency_set, webhook_endpoint_update
from webhooks.services.relay import outbox_event_requeue


def _status_set(endpoint: WebhookEndpoint, status: str) -> str:
    webhook_endpoint_update(endpoint=endpoint, status=status)
    return f"Endpoint {endpoint.pk} {status}"


class ConcurrencyForm(StaffActionForm):
    max_concurrency = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_ENDPOINT_CONCURRENCY,
        help_text="Requests in flight to this endpoint at once, across every worker. Empty: the platform default.",
    )


def _concurrency_set(endpoint: WebhookEndpoint, data: dict[str, Any]) -> str:
    webhook_endpoint_concurrency_set(endpoint=endpoint, max_concurrency=data.get("max_concurrency"))
    return f"Endpoint {endpoint.pk}: at most {endpoint.max_concurrency or 'the default number of'} requests at once"


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(StaffActionsMixin, ReadOnlyAdmin):
    list_display = ("id", link_column("merchant"), "url", "status", "max_concurrency", "disabled_reason", "created")
    list_filter = ("status",)
    search_fields = ("url",)
    id_search = {"we": "id", "mer": "merchant_id"}
    date_hierarchy = "created"
    list_select_related = ("merchant",)
    fields = ("id", "merchant", "url", "description", "enabled_events", "status", "max_concurrency", "disabled_reason",
              "previous_secret_expires_at", "created", "updated")
    staff_actions = (
        StaffAction("enable", "Enable (deliveries resume)", "webhooks.manage_webhookendpoint", StaffActionForm,
                    lambda request, obj, data: _status_set(obj, WebhookEndpointStatus.ENABLED),
                    show=lambda obj: obj.status != WebhookEndpointStatus.ENABLED),
        StaffAction("disable", "Disable", "webhooks.manage_webhookendpoint", StaffActionForm,
                    lambda request, obj, data: _status_set(obj, WebhookEndpointStatus.DISABLED),
                    show=lambda obj: obj.status == WebhookEndpointStatus.ENABLED),
        StaffAction("concurrency", "Set concurrency", "webhooks.manage_webhookendpoint", ConcurrencyForm,
                    lambda request, obj, data: _concurrency_set(obj, data),
                    description="How many deliveries may be in flight to this endpoint at once (empty: the default)."),
    )


class WebhookDeliveryAttemptInline(ReadOnlyMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = WebhookDeliveryAttempt
    fields = ("attempted_at", "succeeded", "status_code", "latency_ms", "address", "error", "response_excerpt")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(StaffActionsMixin, ReadOnlyAdmin):
    list_display = ("id", link_column("endpoint"), "topic", link_column("event"), "status", "attempts", "last_status_code",
                    "next_attempt_at", "leased_until", "delivered_at", "created")
    list_filter = ("status", "topic")
    id_search = {"whd": "id", "wd": "id", "evt": "event_id", "we": "endpoint_id"}
    date_hierarchy = "created"
    list_select_related = ("endpoint", "event")
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    inlines = [WebhookDeliveryAttemptInline]
    staff_actions = (
        StaffAction("redeliver", "Redeliver", "webhooks.redeliver_webhookdelivery", StaffActionForm,
                    lambda request, obj, data: f"Delivery {webhook_delivery_redeliver(delivery=obj).pk} queued again",
                    description="Due now, with a fresh 3-day retry window."),
    )


@admin.register(OutboxEvent)
class OutboxEventAdmin(StaffActionsMixin, ReadOnlyAdmin):
    list_display = ("id", "topic", "created", "published_at", "attempts", "next_attempt_at", "dead_at", "last_error")
    list_filter = (("published_at", admin.EmptyFieldListFilter), ("dead_at", admin.EmptyFieldListFilter), "topic")
    # An event by its id; the events of an object by the object's id (payload "id": a scan
    # of the outbox, bounded by the list's LIMIT; there is no index on the payload).
    id_search = {"evt": "id", "pay": "payload__id", "ref": "payload__id", "adj": "payload__id", "top": "payload__id",
                 "trf": "payload__id", "pi": "payload__id"}
    search_fields = ("=topic",)
    date_hierarchy = "created"
    readonly_fields = [f.name for f in OutboxEvent._meta.fields]
    staff_actions = (
        StaffAction("requeue", "Requeue (publish again)", "payments.requeue_outboxevent", StaffActionForm,
                    lambda request, obj, data: f"Event {outbox_event_requeue(event=obj).pk} requeued",
                    description="An unpublished or dead-lettered event gets a new round of publication attempts now."),
    )
