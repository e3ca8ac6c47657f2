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
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import redis
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone
from redis.commands.core import Script

from payments.models import OutboxEvent
from wallets.compiled import CompiledInsert, InsertBatch
from wallets.fastredis import fast_redis

logger = logging.getLogger(__name__)

RELAY_TASK_NAME = "webhooks.outbox_relay"
_EVENT_INSERT = CompiledInsert(OutboxEvent)  # every money movement writes one (wallets.compiled)


def outbox_event_create(
    *, topic: str, payload: Mapping[str, Any], created: datetime | None = None, batch: InsertBatch | None = None,
    sequence: int | None = None,
) -> OutboxEvent:
    """Record an event in the caller's transaction; the relay publishes it after commit.
    With `batch`, the row goes when the caller executes the batch, in this transaction
    (one must be open: the relay is kicked on its commit).

    The event's `sequence` among its object's events (`payload["id"]`) is the object's
    last one plus one, read here: the caller holds the object's row lock, or the object
    is new, so its events are numbered in the order its changes commit. A caller that
    knows the number (1 for an event about a new object) passes it and saves the read.
    Locks: none (the caller's)."""
    object_id = str(payload.get("id") or "")
    if sequence is None and not object_id:
        sequence = 0  # about no object: nothing to order it among
    elif sequence is None:
        last = OutboxEvent.objects.filter(object_id=object_id).order_by("-sequence").values_list("sequence", flat=True).first()
        sequence = (last or 0) + 1
    event = OutboxEvent(
        topic=topic, payload=dict(payload), created=created or timezone.now(), object_id=object_id, sequence=sequence
    )
    if batch is not None and not connection.in_atomic_block:
        raise TransactionManagementError("an event added to a batch needs the caller's transaction")
    if batch is None:
        _EVENT_INSERT.insert(event)
    else:
        batch.add(_EVENT_INSERT, [event])
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
        kick_token = ""
        try:
            if current_app.conf.task_always_eager:
                # send_task ignores eager mode: run the registered task in this process
                # (tests, and `CELERY_TASK_ALWAYS_EAGER=true` set-ups), as the worker would.
                task = current_app.tasks.get(RELAY_TASK_NAME)
                if task is not None:
                    task.apply(headers=headers)
                return
            kick_token = secrets.token_hex(8)
            wait_ms = _kick_pending_claim(self.schema_name, kick_token=kick_token)
            if wait_ms is None:
                return  # a kicked relay has not started yet: it will read this commit's event
            # No publish retries: a broker that is down must not hold the request; the
            # beat sweep catches up.
            current_app.send_task(
                RELAY_TASK_NAME, kwargs={"kick_token": kick_token}, headers=headers, retry=False, ignore_result=True,
                countdown=wait_ms / 1000 if wait_ms else None,
            )
        except Exception:  # the money committed; the sweep relays what this kick missed
            _kick_pending_drop(self.schema_name, kick_token=kick_token)
            logger.warning("outbox relay kick failed; the beat sweep will relay", exc_info=True)


# --- Coalescing kicks -------------------------------------------------------------------
#
# A kick is a Celery publish (~1 ms of Python). Under load most of them are redundant: a
# relay kicked earlier has not started yet. So a kick first marks "a kick is pending" for
# its schema in Redis, the mark holding a token the kick sends its task; if the mark is
# already there, it sends nothing. That relay, and only that one, clears the mark when it
# starts, BEFORE it reads the outbox (`outbox_relay_kick_pending_clear`, called by
# webhooks' relay with the task's token). Why no event waits: a commit that finds the mark
# committed before it looked, and the relay holding that token has not cleared it yet, so
# that relay's reads come after this commit and see its event. A mark whose publish failed
# is cleared at once; one whose relay never runs (a lost message) expires after
# KICK_PENDING_SECONDS, and the beat sweep relays meanwhile.
#
# Why only the kicked relay clears it: when any relay's start cleared the mark, a beat
# sweep's relay starting while a kicked one waited out its countdown let the next commit
# kick a second one, and from then on two kicked relays alternated, each re-kicked after
# its own start: relays every 50 ms, not 100, with half the events a run (measured
# under load). With the token at most one kicked relay is pending at a time.
#
# Relays of one schema also start at most every RELAY_MIN_INTERVAL_MS: a kick that comes
# sooner after the last relay started sends its task with a countdown for the rest of the
# interval. A relay run costs ~4 ms of CPU and 9 statements whatever it finds
# (5.6 ms per event at one event a run, 2.6 at twenty), and
# under steady payments a run per commit took that from the web workers on the same
# cores. The interval adds at most itself to an event's lag; the first event after a
# quiet spell waits for nothing. Each step is one Lua script, one round trip, timed by
# Redis's own clock.

KICK_PENDING_SECONDS = 2
RELAY_MIN_INTERVAL_MS = 100

# KEYS: the pending mark, the last relay start (ms). ARGV: the mark's TTL (ms), the interval
# (ms), the kick's token. Returns -1 when another kick is pending already, else the ms to
# wait before the relay. A mark holding this kick's own token is its own: redis-py resends
# a command whose answer timed out, and the resent claim must not take the first one's
# mark for another kick's (no relay would be sent).
_KICK_CLAIM_LUA = b"""
if not redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ARGV[1]) and redis.call('GET', KEYS[1]) ~= ARGV[3] then return -1 end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local now = redis.call('TIME')
local wait = last + tonumber(ARGV[2]) - (tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
if wait < 0 then return 0 end
if wait > tonumber(ARGV[2]) then return tonumber(ARGV[2]) end
return wait
"""
# KEYS: the pending mark, the last relay start. ARGV: the relay's kick token ('' for a
# relay no kick sent). Clears the mark if it holds that token; records the start (ms).
_RELAY_STARTED_LUA = b"""
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local now = redis.call('TIME')
redis.call('SET', KEYS[2], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), 'PX', 60000)
return 1
"""
# KEYS: the pending mark. ARGV: the kick's token. Drops the mark if it is still that kick's.
_KICK_DROP_LUA = b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
# Sent by SHA (EVALSHA); Redis loads a script on its first use. Bound to a client per call.
_KICK_CLAIM = Script(None, _KICK_CLAIM_LUA)  # type: ignore[arg-type]
_RELAY_STARTED = Script(None, _RELAY_STARTED_LUA)  # type: ignore[arg-type]
_KICK_DROP = Script(None, _KICK_DROP_LUA)  # type: ignore[arg-type]


def _kick_pending_key(schema_name: str) -> str:
    return f"tally:outbox:kick_pending:{schema_name}"


def _relay_started_key(schema_name: str) -> str:
    return f"tally:outbox:relay_started_ms:{schema_name}"


def _kick_pending_claim(schema_name: str, *, kick_token: str) -> int | None:
    """None when a kick is pending already (send nothing); else how many ms the relay this
    commit kicks must wait, so that relays start at most every RELAY_MIN_INTERVAL_MS. The
    mark now holds `kick_token`."""
    keys = [_kick_pending_key(schema_name), _relay_started_key(schema_name)]
    try:
        wait_ms = int(_KICK_CLAIM(keys=keys, args=[KICK_PENDING_SECONDS * 1000, RELAY_MIN_INTERVAL_MS, kick_token], client=fast_redis()))
    except redis.RedisError:
        return 0  # cannot tell: kick now
    return None if wait_ms < 0 else wait_ms


def _kick_pending_drop(schema_name: str, *, kick_token: str) -> None:
    """A kick's publish failed: the next commit kicks again (no relay started, so no interval)."""
    if not kick_token:
        return  # it failed before it claimed the mark
    try:
        _KICK_DROP(keys=[_kick_pending_key(schema_name)], args=[kick_token], client=fast_redis())
    except redis.RedisError:
        pass  # the mark expires by itself


def outbox_relay_kick_pending_clear(*, schema_name: str, kick_token: str = "") -> None:
    """A relay of `schema_name` starts: record its start, and if it is the relay the pending
    mark's kick sent (`kick_token`), clear the mark, so the next commit kicks again (after
    the interval). Call it before reading the outbox. A relay no kick sent (the beat sweep,
    `manage.py outbox_relay`, an earlier kick's whose mark lapsed) leaves the mark alone:
    the kicked relay it stands for has still to run."""
    try:
        _RELAY_STARTED(keys=[_kick_pending_key(schema_name), _relay_started_key(schema_name)], args=[kick_token], client=fast_redis())
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
