"""Request and response shapes of the merchant's webhook endpoints. Shapes only: the
rules (https, event types, limits) live in webhooks.services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers as S

from apikit.base import StrictSerializer
from apikit.fields import ConstField, TextField, strict_char
from apikit.pagination import ListParamsSerializer, list_serializer
from apikit.shapes import ObjectOut, Serializer
from webhooks.services.endpoints import EVENT_TYPE_RE, MAX_EVENT_TYPES


class WebhookEndpointOut(ObjectOut):
    object_type = "webhook_endpoint"
    url = S.CharField()
    description = S.CharField()
    enabled_events = S.ListField(child=S.CharField())
    status = S.CharField()
    disabled_reason = S.CharField(help_text="Why Tally disabled the endpoint (empty unless disabled after persistent failure).")


class WebhookEndpointWithSecretOut(WebhookEndpointOut):
    secret = S.CharField(help_text="Signing secret (whsec_...). Shown once: store it now.")


# What deliveries can reach, as a pattern a client can check: https, a DNS name (letters,
# digits and hyphens; at most 207 characters, within DNS's 253), an optional port, a path.
# The server also refuses a name that does not resolve, or resolves to a private or
# loopback address. Beyond type and length, every rule is the service's: any URL it refuses
# gets one code and message (webhook_url_not_allowed), malformed or internal alike.
WEBHOOK_URL_PATTERN = (
    r"^https://(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?\.){1,3}[A-Za-z]{2,24}(?::[1-9][0-9]{0,3})?(?:/[A-Za-z0-9._~/-]{0,1000})?$"
)


@extend_schema_field({"type": "string", "maxLength": 2048, "pattern": WEBHOOK_URL_PATTERN,
                      "description": "https URL of a public host that receives the signed events."})
class WebhookUrlField(TextField):
    pass


def _event_type() -> S.RegexField:
    return S.RegexField(
        EVENT_TYPE_RE, max_length=100, help_text="An event type such as payment.succeeded, or * for every type.",
        error_messages={"invalid": "must be an event type such as payment.succeeded, or *"},
    )


class WebhookEndpointCreateIn(StrictSerializer):
    url = WebhookUrlField(max_length=2048)
    enabled_events = S.ListField(child=_event_type(), min_length=1, max_length=MAX_EVENT_TYPES)
    description = strict_char(required=False, allow_blank=True, default="")


class WebhookEndpointUpdateIn(StrictSerializer):
    url = WebhookUrlField(max_length=2048, required=False)
    enabled_events = S.ListField(child=_event_type(), min_length=1, max_length=MAX_EVENT_TYPES, required=False)
    description = strict_char(required=False, allow_blank=True)
    status = S.ChoiceField(choices=["enabled", "disabled"], required=False)


class WebhookSecretRotateIn(StrictSerializer):
    overlap_seconds = S.IntegerField(
        required=False, min_value=0, max_value=7 * 24 * 3600, default=24 * 3600,
        help_text="How long the old secret keeps signing deliveries (default 24 h, at most 7 days).",
    )


class WebhookDeliveryOut(ObjectOut):
    object_type = "webhook_delivery"
    endpoint = S.CharField(source="endpoint_id")
    event = S.CharField(source="event_id", help_text="The event's stable id (evt_...): receivers dedupe on it.")
    type = S.CharField(source="topic")
    status = S.ChoiceField(choices=["pending", "succeeded", "failed", "expired"])
    attempts = S.IntegerField()
    next_attempt_at = S.SerializerMethodField(help_text="When a pending delivery is tried next (null unless pending).")
    last_attempt_at = S.DateTimeField(allow_null=True)
    last_status_code = S.IntegerField(allow_null=True, help_text="HTTP status of the last attempt (null: no answer).")
    last_error = S.CharField()
    delivered_at = S.DateTimeField(allow_null=True)

    def get_next_attempt_at(self, obj: Any) -> str | None:
        return S.DateTimeField().to_representation(obj.next_attempt_at) if obj.status == "pending" else None


WebhookDeliveryList = list_serializer(WebhookDeliveryOut, "WebhookDeliveryList")


class WebhookRedeliverIn(StrictSerializer):
    delivery = S.RegexField(
        r"^wh?d_[A-Za-z0-9]{1,40}$", max_length=64, help_text="The delivery (whd_..., or wd_... for older ones) of this endpoint to send again."
    )


class EventOut(Serializer):
    """An event exactly as its webhook deliveries carry it (the body they sign), so a
    receiver catching up from the list handles it with the same code."""

    id = S.CharField(help_text="The event's stable id (evt_...): the same in every delivery; dedupe on it.")
    object = ConstField("event")
    type = S.CharField(source="topic")
    created = S.SerializerMethodField(help_text="When the event happened (Unix seconds), as in its deliveries.")
    sequence = S.IntegerField(help_text="The event's place among its object's events (1, 2, 3...; 0 for events from before sequences).")
    # DRF's metaclass takes declared fields off the class, so `.data` stays the serializer's.
    data = S.SerializerMethodField(help_text="`object`: the object as the event left it.")  # type: ignore[assignment]

    def get_created(self, obj: Any) -> int:
        return int(obj.created.timestamp())

    def get_data(self, obj: Any) -> dict[str, Any]:
        return {"object": obj.payload}


class EventListParams(ListParamsSerializer):
    type = S.RegexField(
        r"^[a-z][a-z_]{0,40}(\.[a-z][a-z_]{0,40}){0,3}$", required=False, max_length=100,
        help_text="Only events of this type (payment.succeeded, ...).",
    )
