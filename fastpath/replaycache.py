"""A Redis read-through cache of completed responses, for replays that skip PostgreSQL.
It never decides anything: an entry carries its request's fingerprint, its tenant's
schema and the end of its replay window, and its TTL never outlives that window, so it
only ever says what PostgreSQL would. Redis down: a miss, and a short circuit breaker
stops paying the connect timeout. Entries live under the caller's namespace (the
idempotency engine's names its sealing ring: an entry may hold a sealed body)."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.cache.backends.redis import RedisSerializer
from django.db import connection

logger = logging.getLogger("tally.idempotency")

MAX_TTL_SECONDS = 3600
BREAKER_SECONDS = 5.0

_breaker_open_until = 0.0  # one float, assigned whole: threads need no lock


@dataclass(frozen=True)
class CachedResponse:
    fingerprint: str
    status: int
    headers: dict[str, str]
    body: bytes
    request_id: str
    replay_until: float  # epoch seconds


@dataclass(frozen=True)
class ReplayPrefetch:
    """The replay-cache lookup of (principal, key), made in the throttles' Redis call."""

    principal_id: str
    key: str
    entry: CachedResponse | None


def _schema_name() -> str:
    return str(getattr(connection, "schema_name", "public"))


def _cache_key(namespace: str, principal_id: str, key: str) -> str:
    digest = hashlib.sha256(f"{principal_id}\x00{key}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"idem:v1:{namespace}:{digest}"


def _breaker_open() -> bool:
    return time.monotonic() < _breaker_open_until


def _breaker_trip(exc: BaseException) -> None:
    global _breaker_open_until
    _breaker_open_until = time.monotonic() + BREAKER_SECONDS
    logger.warning("idempotency replay cache unavailable, bypassing for %ss: %s", BREAKER_SECONDS, type(exc).__name__)


def replay_cache_breaker_reset() -> None:
    global _breaker_open_until
    _breaker_open_until = 0.0


def replay_cache_redis_key(*, namespace: str, principal_id: str, key: str) -> str | None:
    """The Redis key of (principal, key)'s entry, for a caller that GETs it itself (decode with
    `replay_cache_entry_decode`); None with the breaker open or another Redis than REDIS_URL."""
    if _breaker_open() or settings.CACHES.get("default", {}).get("LOCATION") != getattr(settings, "REDIS_URL", None):
        return None
    return str(cache.make_and_validate_key(_cache_key(namespace, principal_id, key)))


_serializer = RedisSerializer()


def replay_cache_entry_decode(raw: bytes | None) -> CachedResponse | None:
    """A raw GET answer for `replay_cache_redis_key` -> the entry, or None (a miss)."""
    if raw is None:
        return None
    try:
        value = _serializer.loads(raw)
    except Exception:  # noqa: BLE001 - an undecodable entry is a miss
        return None
    return _entry_of(value)


def replay_cache_get(*, namespace: str, principal_id: str, key: str) -> CachedResponse | None:
    if _breaker_open():
        return None
    try:
        raw: Any = cache.get(_cache_key(namespace, principal_id, key))
    except Exception as exc:  # noqa: BLE001 - any Redis failure is a miss, never an error
        _breaker_trip(exc)
        return None
    return _entry_of(raw)


def _entry_of(raw: Any) -> CachedResponse | None:
    if not isinstance(raw, dict) or raw.get("schema") != _schema_name():
        return None
    try:
        entry = CachedResponse(
            fingerprint=str(raw["fingerprint"]),
            status=int(raw["status"]),
            headers={str(k): str(v) for k, v in dict(raw["headers"]).items()},
            body=bytes(raw["body"]),
            request_id=str(raw["request_id"]),
            replay_until=float(raw["replay_until"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if time.time() >= entry.replay_until:
        return None
    return entry


def replay_cache_set(*, namespace: str, principal_id: str, key: str, entry: CachedResponse) -> None:
    ttl = min(MAX_TTL_SECONDS, int(entry.replay_until - time.time()))
    if ttl <= 0 or _breaker_open():
        return
    try:
        cache.set(_cache_key(namespace, principal_id, key), {"schema": _schema_name(), **asdict(entry)}, ttl)
    except Exception as exc:  # noqa: BLE001
        _breaker_trip(exc)


def replay_cache_clear(*, batch: int = 500) -> int | None:
    """Drop the current tenant's entries, of every namespace (the cache's key function puts the
    schema first in every key): what a tenant restore calls, since an entry recorded after the
    restore point answers for a record the restored schema does not hold. Always safe (the
    cache never decides: a miss reads PostgreSQL); the cost is one SCAN of the cache's Redis,
    filtered there. The number dropped, or None when Redis could not be reached (entries then
    live to their TTL, MAX_TTL_SECONDS at most)."""
    try:
        client = cache._cache.get_client(write=True)  # type: ignore[attr-defined]  # Django's RedisCache: no public SCAN
        dropped, keys = 0, []
        for name in client.scan_iter(match=cache.make_key("idem:v1:*"), count=1000):
            keys.append(name)
            if len(keys) >= batch:
                dropped += int(client.unlink(*keys))
                keys = []
        if keys:
            dropped += int(client.unlink(*keys))
    except Exception:  # any Redis failure: logged, never raised into the restore
        logger.exception("idempotency replay cache not cleared: entries recorded after a restore point live to their TTL")
        return None
    return dropped
