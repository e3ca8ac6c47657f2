"""Events committed with the movement they describe (SPEC 8)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from payments.models import OutboxEvent


def outbox_event_create(*, topic: str, payload: Mapping[str, Any], created: datetime | None = None) -> OutboxEvent:
    """Record an event in the caller's transaction (the relay publishes it after commit)."""
    return OutboxEvent.objects.create(topic=topic, payload=dict(payload), created=created or timezone.now())


def epoch_seconds(value: datetime) -> int:
    return int(value.timestamp())
