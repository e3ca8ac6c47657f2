"""Epochs: one opaque Redis value per key that changes after every committed write that
must end trust in what other processes cached under the old value.

A cache records with each entry the epoch it read BEFORE its database read, and trusts
the entry only while the epoch is unchanged; a write commits, then bumps. A missing key
is created with a random 62-bit value, never 0, so a restarted counter cannot come back
to a value an old entry recorded (ABA). Redis down: reads answer None (trust nothing)
and back off for READ_BACKOFF_SECONDS; a failed bump answers False.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

import redis

from fastpath.fastredis import fast_redis

logger = logging.getLogger("tally.fastpath")

READ_BACKOFF_SECONDS = 5.0

_read_down_until = 0.0


def _pipeline(key: str) -> Any:
    """A pipeline that first creates `key`, if missing, with a random 62-bit value."""
    pipe = fast_redis().pipeline(transaction=False)
    pipe.set(key, 1 + secrets.randbits(62), nx=True)
    return pipe


def epoch_read(*, key: str) -> bytes | None:
    """The current epoch under `key` (created if missing), or None when Redis cannot answer."""
    global _read_down_until
    now = time.monotonic()
    if now < _read_down_until:
        return None
    try:
        pipe = _pipeline(key)
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
        pipe = _pipeline(key)
        pipe.incr(key)
        pipe.execute()
    except redis.RedisError:
        return False
    return True
