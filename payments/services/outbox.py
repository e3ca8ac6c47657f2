"""Events committed with the movement they describe (SPEC 8), and the one after-commit
helper that kicks the relay.

The relay lives above payments (webhooks.tasks, task "webhooks.outbox_relay"); payments
never imports it. Once per transaction that wrote an event, `outbox_relay_kick_on_commit`
registers a `transaction.on_commit` callback that sends the task BY NAME with the tenant
schema in the header tenant-schemas-celery reads (`_schema_name`). The kick is only for
latency: if it fails (broker down, a crash between commit and send) nothing is lost, the
beat sweep ("webhooks.relay_all_tenants") relays the event a few seconds later. It never
raises into the caller: the money has already committed when it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import redis
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from payments.models import OutboxEvent
from wallets.compiled import CompiledInsert
from wallets.fastredis import fast_redis

logger = logging.getLogger(__name__)

RELAY_TASK_NAME = "webhooks.outbox_relay"
_EVENT_INSERT = CompiledInsert(OutboxEvent)  # every money movement writes one (wallets.compiled)


def outbox_event_create(*, topic: str, payload: Mapping[str, Any], created: datetime | None = None) -> OutboxEvent:
    """Record an event in the caller's transaction; the relay publishes it after commit."""
    event = _EVENT_INSERT.insert(OutboxEvent(topic=topic, payload=dict(payload), created=created or timezone.now()))
    outbox_relay_kick_on_commit()
    return event


class _RelayKick:
    """The on-commit callback: one per transaction and tenant schema."""

    def __init__(self, schema_name: str) -> None:
        self.schema_name = schema_name

    def __call__(self) -> None:
        if not getattr(settings, "TALLY_OUTBOX_RELAY_KICK", True):
            return  # kicks off: the beat sweep alone relays
        headers = {"_schema_name": self.schema_name}
        try:
            if current_app.conf.task_always_eager:
                # send_task ignores eager mode: run the registered task in this process
                # (tests, and `CELERY_TASK_ALWAYS_EAGER=true` set-ups), as the worker would.
                task = current_app.tasks.get(RELAY_TASK_NAME)
                if task is not None:
                    task.apply(headers=headers)
                return
            if not _kick_pending_claim(self.schema_name):
                return  # a kicked relay has not started yet: it will read this commit's event
            # No publish retries: a broker that is down must not hold the request; the
            # beat sweep catches up.
            current_app.send_task(RELAY_TASK_NAME, headers=headers, retry=False, ignore_result=True)
        except Exception:  # the money committed; the sweep relays what this kick missed
            outbox_relay_kick_pending_clear(schema_name=self.schema_name)
            logger.warning("outbox relay kick failed; the beat sweep will relay", exc_info=True)


# --- Coalescing kicks -------------------------------------------------------------------
#
# A kick is a Celery publish (~1 ms of Python). Under load most of them are redundant: a
# relay kicked earlier has not started yet. So a kick first marks "a kick is pending" for
# its schema in Redis (SET NX, one round trip); if the mark is already there, it sends
# nothing. The relay clears the mark when it starts, BEFORE it reads the outbox
# (`outbox_relay_kick_pending_clear`, called by webhooks' relay). Why no event waits: a
# commit that finds the mark committed before it looked, and the relay that will clear the
# mark has not cleared it yet, so that relay's reads come after this commit and see its
# event. A mark whose publish failed is cleared at once; one whose relay never runs (a
# lost message) expires after KICK_PENDING_SECONDS, and the beat sweep relays meanwhile.

KICK_PENDING_SECONDS = 2


def _kick_pending_key(schema_name: str) -> str:
    return f"tally:outbox:kick_pending:{schema_name}"


def _kick_pending_claim(schema_name: str) -> bool:
    """True when this commit must send a kick (none is pending for the schema)."""
    try:
        return bool(fast_redis().set(_kick_pending_key(schema_name), b"1", nx=True, ex=KICK_PENDING_SECONDS))
    except redis.RedisError:
        return True  # cannot tell: kick


def outbox_relay_kick_pending_clear(*, schema_name: str) -> None:
    """The relay of `schema_name` starts: the next commit's kick is needed again. Call it
    before reading the outbox."""
    try:
        fast_redis().delete(_kick_pending_key(schema_name))
    except redis.RedisError:
        pass  # the mark expires by itself


def outbox_relay_kick_on_commit() -> None:
    """Kick the relay once after the current transaction commits (at once outside one)."""
    schema_name = str(getattr(connection, "schema_name", "public"))
    for entry in connection.run_on_commit:
        callback = entry[1]
        if isinstance(callback, _RelayKick) and callback.schema_name == schema_name:
            return
    transaction.on_commit(_RelayKick(schema_name), robust=True)


def epoch_seconds(value: datetime) -> int:
    return int(value.timestamp())
