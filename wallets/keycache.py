"""The per-process cache of live API keys (fastpath.epochs.EpochCache), trusted through the
tenant's API key epoch in Redis. A live key is kept per (tenant schema, key hash) for at
most TALLY_API_KEY_CACHE_SECONDS, under the epoch read BEFORE the database read that filled
it; a hit is trusted only once `api_key_cache_confirm` finds that epoch still current (read
in the request's throttle call). Revoke and rotate bump the epoch after commit. Unknown,
revoked, expired and staff keys are never cached. Redis down: nothing is cached or trusted.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from fastpath.epochs import EpochCache, epoch_bump
from wallets.metrics import API_KEY_EPOCH_BUMP_FAILURES
from wallets.models import ApiKey
from wallets.selectors import api_key_get_active_by_hash, api_key_hash

logger = logging.getLogger("tally.wallets")

def api_key_epoch_redis_key(*, schema: str) -> str:
    return f"tally:api_key_epoch:{schema}"


def api_key_epoch_bump(*, schema: str) -> bool:
    """Change the tenant's API key epoch. False, logged and counted, when Redis cannot take
    it: other processes then trust their entries until their TTL."""
    if epoch_bump(key=api_key_epoch_redis_key(schema=schema)):
        return True
    API_KEY_EPOCH_BUMP_FAILURES.labels(tenant=schema).inc()
    logger.error(
        "api key epoch bump failed: other processes may accept the changed key until their cache entry expires",
        extra={"schema": schema, "ttl_seconds": settings.TALLY_API_KEY_CACHE_SECONDS},
    )
    return False


def _api_key_copy(api_key: ApiKey) -> ApiKey:
    copied = copy.copy(api_key)
    for name in ("customer", "merchant", "terminal", "staff"):
        if name in api_key._state.fields_cache:
            related = api_key._state.fields_cache[name]
            copied._state.fields_cache[name] = copy.copy(related) if related is not None else None
    return copied


# Staff keys are not kept: the database guard that revokes a deactivated login's keys
# (wallets migration 0015) bumps no epoch, so a cached one could outlive a deactivation
# and reactivation done without a save.
_api_key_cache: EpochCache[tuple[str, str], ApiKey] = EpochCache(
    read=lambda cache_key: api_key_get_active_by_hash(key_hash=cache_key[1]),
    epoch_key=lambda cache_key: api_key_epoch_redis_key(schema=cache_key[0]),
    ttl=lambda: float(settings.TALLY_API_KEY_CACHE_SECONDS),
    copy=_api_key_copy,
    keep=lambda api_key: api_key.staff_id is None,
    live=lambda api_key: api_key.expires_at is None or api_key.expires_at > timezone.now(),
)


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
    """A copy of the cached entry for `raw_key` in this schema, or None (also once expired)."""
    cache_key = _api_key_cache_key(raw_key)
    cached = _api_key_cache.get(cache_key)
    return None if cached is None else ApiKeyCacheHit(api_key=cached[0], cache_key=cache_key, epoch=cached[1])


def api_key_cache_confirm(*, hit: ApiKeyCacheHit, epoch_now: bytes | None) -> ApiKey | None:
    """The hit's key if the tenant's epoch (read before this call) is still the one it was
    cached under; else the key as PostgreSQL has it now, or None if it is dead."""
    return _api_key_cache.confirm(hit.cache_key, hit.api_key, epoch=hit.epoch, epoch_now=epoch_now)


def api_key_cache_fill(*, raw_key: str) -> ApiKey | None:
    """`api_key_get_active`, caching a live key under the tenant's epoch read first."""
    return _api_key_cache.fill(_api_key_cache_key(raw_key))


def api_key_cache_invalidate() -> None:
    """Make every process stop trusting its cached keys of this tenant: this one now and on
    commit, the others by bumping the epoch after commit (before it, a process could cache
    the old row under the new epoch). Call in the transaction that writes the change."""
    schema = str(getattr(connection, "schema_name", "public"))

    def after_commit() -> None:
        _api_key_cache.clear()
        api_key_epoch_bump(schema=schema)

    _api_key_cache.clear()
    transaction.on_commit(after_commit, robust=True)
