"""Request and response shapes of the merchant's webhook endpoints. Shapes only: the
rules (https, event types, limits) live in webhooks.services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers as S

from payments.api.base import StrictSerializer
from payments.api.fields import strict_char
from payments.api.pagination import list_serializer
from payments.api.serializers import ConstField


class WebhookEndpointOut(S.Serializer[Any]):
    id = S.CharField()
    object = ConstField("webhook_endpoint")
    created = S.DateTimeField()
    url = S.CharField()
    description = S.CharField()
    enabled_events = S.ListField(child=S.CharField())
    status = S.CharField()


class WebhookEndpointWithSecretOut(WebhookEndpointOut):
    secret = S.CharField(help_text="Signing secret (whsec_...). Shown once: store it now.")


class WebhookEndpointCreateIn(StrictSerializer):
    url = S.URLField(max_length=2048)
    enabled_events = S.ListField(child=S.CharField(max_length=100), min_length=1, max_length=50)
    description = strict_char(required=False, allow_blank=True, default="")


class WebhookEndpointUpdateIn(StrictSerializer):
    url = S.URLField(max_length=2048, required=False)
    enabled_events = S.ListField(child=S.CharField(max_length=100), min_length=1, max_length=50, required=False)
    description = strict_char(required=False, allow_blank=True)
    status = S.ChoiceField(choices=["enabled", "disabled"], required=False)


class WebhookSecretRotateIn(StrictSerializer):
    overlap_seconds = S.IntegerField(
        required=False, min_value=0, max_value=7 * 24 * 3600, default=24 * 3600,
        help_text="How long the old secret keeps signing deliveries (default 24 h, at most 7 days).",
    )


WebhookEndpointList = list_serializer(WebhookEndpointOut, "WebhookEndpointList")
