"""Failures of the webhooks app (domain codes; the API maps them)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import InvalidRequest


class WebhookErrorCode(StrEnum):
    ENDPOINT_INVALID = "webhook_endpoint_invalid"


class WebhookEndpointInvalid(InvalidRequest):
    code: ClassVar[StrEnum] = WebhookErrorCode.ENDPOINT_INVALID
