"""Epochs: one opaque Redis value per key, changed after every committed write that must
end trust in what other processes cached under the old value, and the per-process cache
that stands on them (`EpochCache`, the API key cache's). An entry records the epoch read
BEFORE its database read and is trusted only while it is unchanged; a write commits, then
bumps. A missing key starts at a random 62-bit value, so a restarted counter cannot come
back to a value an old entry recorded (ABA). Redis down: reads answer None (trust nothing)
and back off for READ_BACKOFF_SECONDS.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import redis

from fastpath.fastredis import fast_redis

logger = logging.getLogger("tally.fastpath")

READ_BACKOFF_SECONDS = 5.0

_read_down_until = 0.0


def _pipeline(key: str) -> Any:
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
    """Change the epoch under `key`, after the write committed; False when Redis cannot take it."""
    try:
        pipe = _pipeline(key)
        pipe.incr(key)
        pipe.execute()
    except redis.RedisError:
        return False
    return True


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class EpochCache(Generic[K, V]):
    """Values read from the database (`read`), kept in this process for at most `ttl()`
    seconds under the epoch at `epoch_key(key)` read before the read, and handed out as
    copies (`copy`). A value is kept only if `keep(value)`, Redis answered the epoch read,
    and no `clear` ran during the read (it may have read the old row); an entry no longer
    `live` is dropped. At most `max_entries` are kept (then it starts over). A `ttl()` of
    0 or less: nothing is cached, nor is the epoch read."""

    def __init__(
        self, *, read: Callable[[K], V | None], epoch_key: Callable[[K], str], ttl: Callable[[], float],
        copy: Callable[[V], V], keep: Callable[[V], bool], live: Callable[[V], bool], max_entries: int = 10_000,
    ) -> None:
        self._read, self._epoch_key, self._ttl = read, epoch_key, ttl
        self._copy, self._keep, self._live = copy, keep, live
        self._max_entries = max_entries
        self._entries: dict[K, tuple[V, float, bytes]] = {}
        self._generation = 0

    def clear(self) -> None:
        """Forget every entry in this process, and keep no read in flight."""
        self._generation += 1
        self._entries.clear()

    def get(self, key: K) -> tuple[V, bytes] | None:
        """The entry for `key` (a copy of its value, and the epoch it was cached under), not
        yet trusted (`confirm`); None: not cached, past its TTL, or no longer live."""
        if self._ttl() <= 0:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, deadline, epoch = entry
        if deadline <= time.monotonic() or not self._live(value):
            self._entries.pop(key, None)
            return None
        return self._copy(value), epoch

    def confirm(self, key: K, value: V, *, epoch: bytes, epoch_now: bytes | None) -> V | None:
        """`value`, as `get` gave it with `epoch`, if the epoch (read before this call) is
        still that one; else the value read now (kept under `epoch_now`)."""
        if epoch_now is not None and epoch_now == epoch:
            return value
        self._entries.pop(key, None)
        return self._read_and_keep(key, epoch=epoch_now)

    def fill(self, key: K) -> V | None:
        """The value read now, kept under the epoch read first."""
        if self._ttl() <= 0:
            return self._read(key)
        return self._read_and_keep(key, epoch=epoch_read(key=self._epoch_key(key)))  # before the database read

    def _read_and_keep(self, key: K, *, epoch: bytes | None) -> V | None:
        generation = self._generation
        value = self._read(key)
        ttl = self._ttl()
        if value is not None and epoch is not None and ttl > 0 and generation == self._generation and self._keep(value):
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            self._entries[key] = (self._copy(value), time.monotonic() + ttl, epoch)
        return value
