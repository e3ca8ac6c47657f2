"""Fixed-window counters in Redis, counted in ONE script call per request, which carries
the request's other reads too (the API key epoch, the replay cache's entry): a pipeline
cost a command object, packing and a callback per command. The API's rate limits stand on
it (apikit.throttling)."""

from __future__ import annotations

import redis
from redis.commands.core import Script

from fastpath.fastredis import fast_redis

# KEYS: the window counters, then the keys to GET; ARGV: how many counters, then their TTLs.
_WINDOWS_COUNT_LUA = b"""
local counters = tonumber(ARGV[1])
local out = {}
for i = 1, counters do
  out[i] = redis.call('INCR', KEYS[i])
  redis.call('EXPIRE', KEYS[i], ARGV[i + 1], 'NX')
end
for i = counters + 1, #KEYS do
  out[i] = redis.call('GET', KEYS[i])
end
return out
"""
# Sent by SHA (EVALSHA); Redis loads the script on its first use. Bound to a client per call.
_WINDOWS_COUNT = Script(None, _WINDOWS_COUNT_LUA)  # type: ignore[arg-type]


def windows_count(windows: list[tuple[str, int]], *, get_keys: list[str]) -> tuple[list[int], list[bytes | None]] | None:
    """INCR the counter of each (key, period) window (it lapses a second after its period)
    and GET each of `get_keys`, in one round trip: the counts, and the values (None where
    missing). None when Redis does not answer."""
    try:
        replies = _WINDOWS_COUNT(
            keys=[key for key, _ in windows] + get_keys, args=[len(windows), *(period + 1 for _, period in windows)], client=fast_redis()
        )
    except redis.RedisError:
        return None
    # A missing key reads as Lua's false, which Redis answers as nil: None here.
    return [int(c) for c in replies[: len(windows)]], list(replies[len(windows) :])
