"""Failures of the webhooks app (domain codes; the API maps them)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import InvalidRequest, InvalidState


class WebhookErrorCode(StrEnum):
    ENDPOINT_INVALID = "webhook_endpoint_invalid"
    TARGET_REFUSED = "webhook_target_refused"
    DELIVERY_NOT_REDELIVERABLE = "webhook_delivery_not_redeliverable"


class WebhookEndpointInvalid(InvalidRequest):
    code: ClassVar[StrEnum] = WebhookErrorCode.ENDPOINT_INVALID


class WebhookTargetRefused(WebhookEndpointInvalid):
    """The URL's host is, or resolves to, an address deliveries must never reach
    (loopback, private, link-local/metadata, multicast, unspecified, reserved)."""

    code: ClassVar[StrEnum] = WebhookErrorCode.TARGET_REFUSED


class WebhookDeliveryNotRedeliverable(InvalidState):
    code: ClassVar[StrEnum] = WebhookErrorCode.DELIVERY_NOT_REDELIVERABLE
