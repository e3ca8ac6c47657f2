"""The per-process cache of live API keys, trusted through the tenant's API key epoch in
Redis (fastpath.epochs). A live key is kept per (tenant schema, key hash) for at most
TALLY_API_KEY_CACHE_SECONDS, with the epoch read BEFORE the database read that filled the
entry. A hit is trusted only once `api_key_cache_confirm` has compared that epoch with the
current one (read in the request's throttle call); else the key is read again. Revoke and
rotate bump the epoch after commit. Unknown, revoked and expired keys are never cached,
nor staff keys (read from PostgreSQL at each request, as their login is);
each hit is checked against the key's own `expires_at` and gets copies of the rows.
Redis down: nothing is cached or trusted.
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


def api_key_epoch_bump(*, schema: str) -> bool:
    """Change the tenant's API key epoch (after commit). False, logged and counted, when
    Redis cannot take it: other processes then trust their entries until their TTL."""
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
    """A cached key, not yet trusted (`api_key_cache_confirm`), with the epoch it was read under."""

    api_key: ApiKey
    cache_key: tuple[str, str]
    epoch: bytes

    @property
    def epoch_redis_key(self) -> str:
        return api_key_epoch_redis_key(schema=self.cache_key[0])


def api_key_cache_get(*, raw_key: str) -> ApiKeyCacheHit | None:
    """The cached entry for `raw_key` in the current schema (a copy), or None: not cached,
    past its TTL, or past the key's own `expires_at`."""
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
    """The hit's key if the tenant's epoch (read before this call) is still the one it was
    cached under; else the key as PostgreSQL has it now, or None if it is dead."""
    if epoch_now is not None and epoch_now == hit.epoch:
        return hit.api_key
    _api_key_cache.pop(hit.cache_key, None)
    return _api_key_read_and_cache(cache_key=hit.cache_key, epoch=epoch_now)


def api_key_cache_fill(*, raw_key: str) -> ApiKey | None:
    """`api_key_get_active`, caching a live key under the tenant's epoch read first."""
    if _api_key_cache_ttl() <= 0:
        return api_key_get_active(raw_key=raw_key)
    cache_key = _api_key_cache_key(raw_key)
    epoch = epoch_read(key=api_key_epoch_redis_key(schema=cache_key[0]))  # before the database read
    return _api_key_read_and_cache(cache_key=cache_key, epoch=epoch)


def _api_key_read_and_cache(*, cache_key: tuple[str, str], epoch: bytes | None) -> ApiKey | None:
    generation = _api_key_cache_generation
    api_key = api_key_get_active_by_hash(key_hash=cache_key[1])
    ttl = _api_key_cache_ttl()
    # Not cached: Redis did not answer (nothing to confirm a hit against), or this
    # process invalidated its cache during the read (the row read may be the old one), or
    # a staff key: the database guard that revokes a deactivated login's keys (wallets
    # migration 0015) bumps no epoch, so a cached one could outlive a deactivation and
    # reactivation done without a save.
    if (api_key is not None and api_key.staff_id is None and epoch is not None and ttl > 0
            and generation == _api_key_cache_generation):
        if len(_api_key_cache) >= _API_KEY_CACHE_MAX_ENTRIES:
            _api_key_cache.clear()
        _api_key_cache[cache_key] = (_api_key_copy(api_key), time.monotonic() + ttl, epoch)
    return api_key


def api_key_cache_invalidate() -> None:
    """Make every process stop trusting its cached keys of this tenant: this one now and on
    commit, the others by bumping the epoch after commit (before, a process could cache
    the old row under the new epoch). Call inside the transaction that writes the change."""
    schema = str(getattr(connection, "schema_name", "public"))

    def after_commit() -> None:
        api_key_cache_clear()
        api_key_epoch_bump(schema=schema)

    api_key_cache_clear()
    transaction.on_commit(after_commit, robust=True)
