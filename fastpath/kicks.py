"""Coalesced kicks (docs/WEBHOOKS.md, "Kick"): at most one pending kick of a worker per
name, and its runs at most every `interval_ms`, decided in Redis by one Lua script a step
(one round trip, Redis's clock). Only the relay holding the pending mark's token clears it,
when it starts and BEFORE it reads the outbox (`kick_started`), so no committed event waits.
"""

from __future__ import annotations

import contextlib

import redis
from django.db import connection
from redis.commands.core import Script

from fastpath.fastredis import fast_redis

# KEYS: the pending mark, the last relay start (ms). ARGV: the mark's TTL (ms), the interval
# (ms), the kick's token. Returns -1 when another kick is pending, else the ms to wait. A
# mark holding this kick's own token is its own (redis-py may resend a timed-out claim).
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


def kick_claim(*, pending_key: str, started_key: str, token: str, pending_ms: int, interval_ms: int) -> int | None:
    """None when a kick is pending already (send nothing); else how many ms the run this
    kick sends must wait, so that runs start at most every `interval_ms`. The pending mark
    (`pending_key`, lapsing after `pending_ms`) now holds `token`. Redis down: 0 (kick now)."""
    try:
        wait_ms = int(_KICK_CLAIM(keys=[pending_key, started_key], args=[pending_ms, interval_ms, token], client=fast_redis()))
    except redis.RedisError:
        return 0
    return None if wait_ms < 0 else wait_ms


def kick_drop(*, pending_key: str, token: str) -> None:
    """A kick's send failed: drop its mark, so the next one kicks again (no run started, so
    no interval). Redis down: the mark lapses by itself."""
    with contextlib.suppress(redis.RedisError):
        _KICK_DROP(keys=[pending_key], args=[token], client=fast_redis())


def kick_started(*, pending_key: str, started_key: str, token: str) -> None:
    """A run starts: record when, and if it is the run the pending mark's kick sent
    (`token`), clear the mark. A run no kick sent ('') leaves the mark alone: the kicked
    run it stands for has still to start. Redis down: the mark lapses by itself."""
    with contextlib.suppress(redis.RedisError):
        _RELAY_STARTED(keys=[pending_key, started_key], args=[token], client=fast_redis())


def on_commit_queued(callback: object) -> bool:
    """Whether a callback equal to `callback` waits for the current transaction's commit
    already (Django's `on_commit` queues every one it is given)."""
    return any(entry[1] == callback for entry in connection.run_on_commit)
