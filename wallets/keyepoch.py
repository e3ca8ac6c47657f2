"""The API key epoch: one Redis value per tenant schema that changes after every committed
write changing what authentication returns for some key of that tenant (revoke, rotate).

The per-process key cache (wallets.selectors) records, with each entry, the epoch it read
BEFORE the entry's database read, and trusts an entry only while the tenant's current
epoch is still that value (apikit.throttling reads it in the request's throttle call). A
write commits, then bumps: a process that read the old row read the epoch before the
commit, so before the bump, and its entry stops being trusted as soon as the bump is
visible.

Values are opaque. A missing key (Redis restarted, flushed, evicted) is created with a
random 62-bit value before it is read or incremented, never from 0: a counter restarted
from 0 could come back to a value an old entry recorded (ABA) and make it trusted again.
Redis down: reads answer None (nothing is cached, nothing is trusted); a failed bump is
logged and counted (`tally_api_key_epoch_bump_failures_total`), and the cache's TTL is
then the bound.
"""

from __future__ import annotations

import logging
import secrets
import time

import redis
from django.conf import settings

from wallets.fastredis import fast_redis
from wallets.metrics import API_KEY_EPOCH_BUMP_FAILURES

logger = logging.getLogger("tally.wallets")

# After a failed read, skip Redis this long: the cache is not used meanwhile (every
# request asks PostgreSQL), and an outage does not add a timeout to every cache miss.
READ_BACKOFF_SECONDS = 5.0

_read_down_until = 0.0


def api_key_epoch_redis_key(*, schema: str) -> str:
    return f"tally:api_key_epoch:{schema}"


def _initial_value() -> int:
    return 1 + secrets.randbits(62)


def api_key_epoch_read(*, schema: str) -> bytes | None:
    """The tenant's current epoch (created if missing), or None when Redis cannot answer."""
    global _read_down_until
    now = time.monotonic()
    if now < _read_down_until:
        return None
    key = api_key_epoch_redis_key(schema=schema)
    try:
        pipe = fast_redis().pipeline(transaction=False)
        pipe.set(key, _initial_value(), nx=True)
        pipe.get(key)
        value = pipe.execute()[-1]
    except redis.RedisError:
        _read_down_until = now + READ_BACKOFF_SECONDS
        logger.warning("api key epoch unavailable: keys are not cached", extra={"schema": schema})
        return None
    return value if isinstance(value, bytes) else None


def api_key_epoch_bump(*, schema: str) -> bool:
    """Change the tenant's epoch (call after the write has committed). False, logged and
    counted, when Redis cannot take it: other processes then trust their entries until
    TALLY_API_KEY_CACHE_SECONDS ends them."""
    key = api_key_epoch_redis_key(schema=schema)
    try:
        pipe = fast_redis().pipeline(transaction=False)
        pipe.set(key, _initial_value(), nx=True)
        pipe.incr(key)
        pipe.execute()
    except redis.RedisError:
        API_KEY_EPOCH_BUMP_FAILURES.labels(tenant=schema).inc()
        logger.error(
            "api key epoch bump failed: other processes may accept the changed key until their cache entry expires",
            extra={"schema": schema, "ttl_seconds": settings.TALLY_API_KEY_CACHE_SECONDS},
        )
        return False
    return True
