"""Epochs: one opaque Redis value per key that changes after every committed write that
must end trust in what other processes cached under the old value.

A cache records, with each entry, the epoch it read BEFORE the entry's database read, and
trusts an entry only while the current epoch is still that value. A write commits, then
bumps: a process that read the old row read the epoch before the commit, so before the
bump, and its entry stops being trusted as soon as the bump is visible.

A missing key (Redis restarted, flushed, evicted) is created with a random 62-bit value
before it is read or incremented, never from 0: a counter restarted from 0 could come
back to a value an old entry recorded (ABA) and make it trusted again. Redis down: reads
answer None (the caller trusts nothing) and back off for READ_BACKOFF_SECONDS, so an
outage does not add a timeout to every cache miss; a failed bump answers False.
"""

from __future__ import annotations

import logging
import secrets
import time

import redis

from fastpath.fastredis import fast_redis

logger = logging.getLogger("tally.fastpath")

READ_BACKOFF_SECONDS = 5.0

_read_down_until = 0.0


def _initial_value() -> int:
    return 1 + secrets.randbits(62)


def epoch_read(*, key: str) -> bytes | None:
    """The current epoch under `key` (created if missing), or None when Redis cannot answer."""
    global _read_down_until
    now = time.monotonic()
    if now < _read_down_until:
        return None
    try:
        pipe = fast_redis().pipeline(transaction=False)
        pipe.set(key, _initial_value(), nx=True)
        pipe.get(key)
        value = pipe.execute()[-1]
    except redis.RedisError:
        _read_down_until = now + READ_BACKOFF_SECONDS
        logger.warning("epoch unavailable: nothing cached under it is trusted", extra={"key": key})
        return None
    return value if isinstance(value, bytes) else None


def epoch_bump(*, key: str) -> bool:
    """Change the epoch under `key` (call after the write has committed); False when Redis
    cannot take it."""
    try:
        pipe = fast_redis().pipeline(transaction=False)
        pipe.set(key, _initial_value(), nx=True)
        pipe.incr(key)
        pipe.execute()
    except redis.RedisError:
        return False
    return True
