"""The per-process cache of live API keys, trusted through the tenant's API key epoch in
Redis (fastpath.epochs).

Authentication runs on every request; the key and its principal cost two statements and
~0.7 ms of Python. A live key is kept here, per (tenant schema, key hash), for at most
TALLY_API_KEY_CACHE_SECONDS, together with the tenant's API key epoch (below)
as read BEFORE the database read that filled the entry. A hit is not trusted on its own:
`api_key_cache_get` returns it with that epoch, and the caller compares it with the
epoch current now (apikit.throttling reads it in the request's throttle call, one round
trip it makes anyway) through `api_key_cache_confirm`, which goes back to PostgreSQL
when the epoch moved or Redis could not answer. Revoke and rotate (wallets.services.
principals) bump the epoch after commit, so every process re-reads the key on its next
request once the bump is visible; they also empty this process's cache at once.
Unknown, revoked and expired keys are never cached: failures always ask PostgreSQL (and
are throttled per address and key prefix). An entry is checked against the key's own
`expires_at` on every hit (a rotation's overlap ends on time). Each hit gets copies of
the rows, never the cached instances. Redis down: nothing is cached or trusted.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from fastpath.epochs import epoch_bump, epoch_read
from wallets.metrics import API_KEY_EPOCH_BUMP_FAILURES
from wallets.models import ApiKey
from wallets.selectors import api_key_get_active, api_key_get_active_by_hash, api_key_hash

logger = logging.getLogger("tally.wallets")


def api_key_epoch_redis_key(*, schema: str) -> str:
    return f"tally:api_key_epoch:{schema}"


def api_key_epoch_read(*, schema: str) -> bytes | None:
    """The tenant's current API key epoch, or None when Redis cannot answer (nothing is
    cached or trusted then)."""
    return epoch_read(key=api_key_epoch_redis_key(schema=schema))


def api_key_epoch_bump(*, schema: str) -> bool:
    """Change the tenant's API key epoch (call after the write has committed). False,
    logged and counted, when Redis cannot take it: other processes then trust their
    entries until TALLY_API_KEY_CACHE_SECONDS ends them."""
    if epoch_bump(key=api_key_epoch_redis_key(schema=schema)):
        return True
    API_KEY_EPOCH_BUMP_FAILURES.labels(tenant=schema).inc()
    logger.error(
        "api key epoch bump failed: other processes may accept the changed key until their cache entry expires",
        extra={"schema": schema, "ttl_seconds": settings.TALLY_API_KEY_CACHE_SECONDS},
    )
    return False


_API_KEY_CACHE_MAX_ENTRIES = 10_000
_api_key_cache: dict[tuple[str, str], tuple[ApiKey, float, bytes]] = {}
_api_key_cache_generation = 0


def api_key_cache_clear() -> None:
    """Forget every cached key in this process (a key was revoked or rotated)."""
    global _api_key_cache_generation
    _api_key_cache_generation += 1
    _api_key_cache.clear()


def _api_key_copy(api_key: ApiKey) -> ApiKey:
    copied = copy.copy(api_key)
    for name in ("customer", "merchant", "terminal", "staff"):
        if name in api_key._state.fields_cache:
            related = api_key._state.fields_cache[name]
            copied._state.fields_cache[name] = copy.copy(related) if related is not None else None
    return copied


def _api_key_cache_ttl() -> float:
    return float(settings.TALLY_API_KEY_CACHE_SECONDS)


def _api_key_cache_key(raw_key: str) -> tuple[str, str]:
    return str(getattr(connection, "schema_name", "public")), api_key_hash(raw_key)


@dataclass(frozen=True)
class ApiKeyCacheHit:
    """A cached key, not yet trusted: `epoch` is the tenant's API key epoch read before
    the entry's database read. Trust it only through `api_key_cache_confirm`."""

    api_key: ApiKey
    cache_key: tuple[str, str]
    epoch: bytes

    @property
    def epoch_redis_key(self) -> str:
        return api_key_epoch_redis_key(schema=self.cache_key[0])


def api_key_cache_get(*, raw_key: str) -> ApiKeyCacheHit | None:
    """The cached entry for `raw_key` in the current schema (a copy), or None: not cached,
    past its TTL, or past the key's own `expires_at`. The caller must confirm the hit."""
    if _api_key_cache_ttl() <= 0:
        return None
    cache_key = _api_key_cache_key(raw_key)
    hit = _api_key_cache.get(cache_key)
    if hit is None:
        return None
    api_key, deadline, epoch = hit
    if deadline <= time.monotonic() or (api_key.expires_at is not None and api_key.expires_at <= timezone.now()):
        _api_key_cache.pop(cache_key, None)
        return None
    return ApiKeyCacheHit(api_key=_api_key_copy(api_key), cache_key=cache_key, epoch=epoch)


def api_key_cache_confirm(*, hit: ApiKeyCacheHit, epoch_now: bytes | None) -> ApiKey | None:
    """The hit's key if the tenant's epoch is still the one it was cached under; otherwise
    (it moved, or `epoch_now` is None: Redis did not answer) the key as PostgreSQL has it
    now, or None if it is dead. `epoch_now` must have been read before this call: a
    re-read is cached under it."""
    if epoch_now is not None and epoch_now == hit.epoch:
        return hit.api_key
    _api_key_cache.pop(hit.cache_key, None)
    return _api_key_read_and_cache(raw_key_hash=hit.cache_key[1], cache_key=hit.cache_key, epoch=epoch_now)


def api_key_cache_fill(*, raw_key: str) -> ApiKey | None:
    """`api_key_get_active`, caching a live key under the tenant's epoch read first (one
    Redis round trip: misses are rare). It never answers from the cache: see
    `api_key_cache_get`."""
    if _api_key_cache_ttl() <= 0:
        return api_key_get_active(raw_key=raw_key)
    cache_key = _api_key_cache_key(raw_key)
    epoch = api_key_epoch_read(schema=cache_key[0])  # before the database read: see above
    return _api_key_read_and_cache(raw_key_hash=cache_key[1], cache_key=cache_key, epoch=epoch)


def _api_key_read_and_cache(*, raw_key_hash: str, cache_key: tuple[str, str], epoch: bytes | None) -> ApiKey | None:
    generation = _api_key_cache_generation
    api_key = api_key_get_active_by_hash(key_hash=raw_key_hash)
    ttl = _api_key_cache_ttl()
    # Not cached: Redis did not answer (nothing to confirm a hit against), or this
    # process invalidated its cache during the read (the row read may be the old one).
    if api_key is not None and epoch is not None and ttl > 0 and generation == _api_key_cache_generation:
        if len(_api_key_cache) >= _API_KEY_CACHE_MAX_ENTRIES:
            _api_key_cache.clear()
        _api_key_cache[cache_key] = (_api_key_copy(api_key), time.monotonic() + ttl, epoch)
    return api_key


def api_key_cache_invalidate() -> None:
    """Make every process stop trusting its cached keys of this tenant: this one now and
    again once the change commits (a row read in between is the old one); the others
    through the tenant's API key epoch, bumped after commit: bumped
    before, a process could read the old row after the bump and cache it under the new
    epoch. Call inside the transaction that writes the change."""
    schema = str(getattr(connection, "schema_name", "public"))

    def after_commit() -> None:
        api_key_cache_clear()
        api_key_epoch_bump(schema=schema)

    api_key_cache_clear()
    transaction.on_commit(after_commit, robust=True)
