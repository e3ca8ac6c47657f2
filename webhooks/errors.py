"""Failures of the webhooks app (domain codes; the API maps them)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import InvalidRequest, InvalidState


class WebhookErrorCode(StrEnum):
    ENDPOINT_INVALID = "webhook_endpoint_invalid"
    ENDPOINT_LIMIT_REACHED = "webhook_endpoint_limit_reached"
    TARGET_REFUSED = "webhook_target_refused"
    URL_NOT_ALLOWED = "webhook_url_not_allowed"
    DELIVERY_NOT_REDELIVERABLE = "webhook_delivery_not_redeliverable"


class WebhookEndpointInvalid(InvalidRequest):
    code: ClassVar[StrEnum] = WebhookErrorCode.ENDPOINT_INVALID


class WebhookEndpointLimitReached(InvalidState):
    """The merchant has as many endpoints as it may: a state of its account, not a fault in the request."""

    code: ClassVar[StrEnum] = WebhookErrorCode.ENDPOINT_LIMIT_REACHED


class WebhookTargetRefused(WebhookEndpointInvalid):
    """The URL's host is, or resolves to, an address deliveries must never reach."""

    code: ClassVar[StrEnum] = WebhookErrorCode.TARGET_REFUSED


class WebhookUrlNotAllowed(WebhookEndpointInvalid):
    """Any URL registration refuses, whatever the reason: one answer (docs/WEBHOOKS.md "One refusal at registration")."""

    code: ClassVar[StrEnum] = WebhookErrorCode.URL_NOT_ALLOWED
    MESSAGE: ClassVar[str] = "url is not allowed: it must be an https URL without credentials whose host resolves, now, to public addresses only"

    def __init__(self, message: str = MESSAGE, *, param: str | None = "url") -> None:
        super().__init__(message, param=param)


class WebhookDeliveryNotRedeliverable(InvalidState):
    code: ClassVar[StrEnum] = WebhookErrorCode.DELIVERY_NOT_REDELIVERABLE
