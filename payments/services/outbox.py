"""Events committed with the movement they describe (SPEC 8). Every event kicks the
relay once its transaction commits (payments.relaykick); the beat sweep relays what a
kick missed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from payments.models import OutboxEvent
from payments.relaykick import outbox_relay_kick_on_commit
from wallets.rows import rows_insert


def outbox_event_create(*, topic: str, payload: Mapping[str, Any], created: datetime | None = None) -> OutboxEvent:
    """Record an event in the caller's transaction; the relay publishes it after commit.
    Locks: none (a new row)."""
    event = OutboxEvent(topic=topic, payload=dict(payload), created=created or timezone.now())
    rows_insert([event])
    outbox_relay_kick_on_commit()
    return event


def outbox_event_new(*, topic: str, payload: Mapping[str, Any], created: datetime | None = None) -> OutboxEvent:
    """An event not yet saved, for the caller to insert with its own rows in this
    transaction (one must be open: the relay is kicked on its commit)."""
    if not connection.in_atomic_block:
        raise TransactionManagementError("an event inserted by its caller needs the caller's transaction")
    outbox_relay_kick_on_commit()
    return OutboxEvent(topic=topic, payload=dict(payload), created=created or timezone.now())


def epoch_seconds(value: datetime) -> int:
    return int(value.timestamp())
