"""The outbox and merchant webhooks in the tenant admin (SPEC 8-9): read-only rows; staff
act through the same services as the API (redeliver, requeue a dead letter, enable or
disable an endpoint). Signing secrets are never shown."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from payments.models import OutboxEvent
from wallets.errors import TallyError
from webhooks.models import WebhookDelivery, WebhookDeliveryAttempt, WebhookEndpoint, WebhookEndpointStatus
from webhooks.services.deliveries import webhook_delivery_redeliver
from webhooks.services.endpoints import webhook_endpoint_update
from webhooks.services.relay import outbox_event_requeue


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(_ReadOnly):
    list_display = ("id", "merchant", "url", "status", "disabled_reason", "created")
    list_filter = ("status",)
    search_fields = ("id", "url", "merchant__id", "merchant__name")
    fields = ("id", "merchant", "url", "description", "enabled_events", "status", "disabled_reason", "previous_secret_expires_at",
              "created", "updated")
    readonly_fields = fields
    actions = ["enable", "disable"]

    def _status_set(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint], status: str) -> None:
        for endpoint in queryset:
            webhook_endpoint_update(endpoint=endpoint, status=status)
        self.message_user(request, f"{queryset.count()} endpoint(s) {status}")

    @admin.action(description="Enable (deliveries resume)")
    def enable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        self._status_set(request, queryset, WebhookEndpointStatus.ENABLED)

    @admin.action(description="Disable")
    def disable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        self._status_set(request, queryset, WebhookEndpointStatus.DISABLED)


class WebhookDeliveryAttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = WebhookDeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("attempted_at", "succeeded", "status_code", "latency_ms", "address", "error", "response_excerpt")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_ReadOnly):
    list_display = ("id", "endpoint", "topic", "event", "status", "attempts", "last_status_code", "next_attempt_at", "delivered_at", "created")
    list_filter = ("status", "topic")
    search_fields = ("id", "event__id", "endpoint__id")
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    inlines = [WebhookDeliveryAttemptInline]
    actions = ["redeliver"]

    @admin.action(description="Redeliver (due now, fresh 3-day retry window)")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        done = 0
        for delivery in queryset:
            try:
                webhook_delivery_redeliver(delivery=delivery)
                done += 1
            except TallyError as exc:
                self.message_user(request, f"{delivery.id}: {exc.message}", level=messages.ERROR)
        self.message_user(request, f"{done} delivery(ies) queued again")


@admin.register(OutboxEvent)
class OutboxEventAdmin(_ReadOnly):
    list_display = ("id", "topic", "created", "published_at", "attempts", "next_attempt_at", "dead_at", "last_error")
    list_filter = (("published_at", admin.EmptyFieldListFilter), ("dead_at", admin.EmptyFieldListFilter), "topic")
    search_fields = ("id", "topic")
    readonly_fields = [f.name for f in OutboxEvent._meta.fields]
    actions = ["requeue"]

    @admin.action(description="Requeue unpublished / dead-lettered events now")
    def requeue(self, request: HttpRequest, queryset: QuerySet[OutboxEvent]) -> None:
        for event in queryset:
            outbox_event_requeue(event=event)
        self.message_user(request, f"{queryset.count()} event(s) requeued")
