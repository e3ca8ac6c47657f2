"""Events committed with the movement they describe (SPEC 8); each kicks the relay once
its transaction commits (payments.relaykick)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from payments.models import OutboxEvent
from payments.relaykick import outbox_relay_kick_on_commit
from wallets.locks import rows_insert


def outbox_event_create(
    *, topic: str, payload: Mapping[str, Any], created: datetime | None = None, sequence: int | None = None
) -> OutboxEvent:
    """Record an event in the caller's transaction; the relay publishes it after commit.
    Locks: none (a new row; its sequence relies on the caller's lock, see `_event_new`)."""
    event = _event_new(topic=topic, payload=payload, created=created, sequence=sequence)
    rows_insert([event])
    outbox_relay_kick_on_commit()
    return event


def outbox_event_new(
    *, topic: str, payload: Mapping[str, Any], created: datetime | None = None, sequence: int | None = None
) -> OutboxEvent:
    """An event not yet saved, for the caller to insert with its own rows in this
    transaction (one must be open: the relay is kicked on its commit)."""
    if not connection.in_atomic_block:
        raise TransactionManagementError("an event inserted by its caller needs the caller's transaction")
    outbox_relay_kick_on_commit()
    return _event_new(topic=topic, payload=payload, created=created, sequence=sequence)


def _event_new(*, topic: str, payload: Mapping[str, Any], created: datetime | None, sequence: int | None) -> OutboxEvent:
    """The event's `sequence` among its object's events (`payload["id"]`) is the last one plus
    one: the caller holds the object's row lock, or the object is new (then it passes 1)."""
    object_id = str(payload.get("id") or "")
    if sequence is None and not object_id:
        sequence = 0  # about no object: nothing to order it among
    elif sequence is None:
        last = OutboxEvent.objects.filter(object_id=object_id).order_by("-sequence").values_list("sequence", flat=True).first()
        sequence = (last or 0) + 1
    return OutboxEvent(topic=topic, payload=dict(payload), created=created or timezone.now(), object_id=object_id, sequence=sequence)


def epoch_seconds(value: datetime) -> int:
    return int(value.timestamp())
