"""Per-key and per-tenant rate limits in Redis (SPEC 5: 429 with Retry-After), fixed windows
counted in one script call per request (fastpath.counters). Rates: DEFAULT_THROTTLE_RATES, or
per tenant `Tenant.extra_settings["throttle_rates"]`. Redis down: fail open for a few seconds
(a rate limit protects capacity, not money)."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import connection
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from apikit.principal import Principal
from fastpath.counters import windows_count
from fastpath.replaycache import ReplayPrefetch, replay_cache_entry_decode
from idempotency.canonical import idempotency_key_is_valid
from idempotency.hotpath import replay_cache_redis_key
from wallets.keycache import ApiKeyCacheHit

logger = logging.getLogger("tally.api")

_DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
REDIS_BACKOFF_SECONDS = 5.0

_redis_down_until = 0.0


def parse_rate(rate: object) -> tuple[int, int] | None:
    """"600/min" -> (600, 60); None or "" -> no limit."""
    if not rate:
        return None
    count, _, period = str(rate).partition("/")
    return int(count), _DURATIONS[period.strip()[0].lower()]


def _rate_for(request: Request, scope: str) -> tuple[int, int] | None:
    tenant = getattr(request._request, "tenant", None)
    overrides: dict[str, Any] = {}
    if tenant is not None and isinstance(getattr(tenant, "extra_settings", None), dict):
        overrides = tenant.extra_settings.get("throttle_rates") or {}
    rate = overrides.get(scope) if scope in overrides else api_settings.DEFAULT_THROTTLE_RATES.get(scope)
    return parse_rate(rate)


class KeyAndTenantThrottle(BaseThrottle):
    """Both limits, per API key and per tenant, in ONE Redis script call; a request over
    either is refused, and Retry-After is the longer wait."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        now = time.time()
        if now < _redis_down_until:
            return True
        schema = getattr(connection, "schema_name", "public")
        principal = request.user
        idents = {"api_key": principal.api_key.id if isinstance(principal, Principal) else None, "tenant": "all"}
        limits: list[tuple[str, int, int]] = []
        for scope, ident in idents.items():
            rate = _rate_for(request, scope)
            if ident is not None and rate is not None:
                limits.append((f"tally:throttle:{schema}:{scope}:{ident}", *rate))
        cache_hit = getattr(request._request, "api_key_cache_hit", None)
        epoch_key = cache_hit.epoch_redis_key if isinstance(cache_hit, ApiKeyCacheHit) else None
        if not limits and epoch_key is None:
            return True
        prefetch = _replay_prefetch_target(request, view)
        answer = _windows_count(limits, now=now, get_keys=[key for key in (epoch_key, prefetch and prefetch[2]) if key])
        if answer is None:
            return True
        self._wait, got = answer
        if epoch_key is not None:  # for apikit.auth.api_key_cache_confirm
            request._request.api_key_epoch_now = got.pop(0)  # type: ignore[attr-defined]
        if prefetch is not None:  # for the idempotency layer's first look
            request._request.idempotency_replay_prefetch = ReplayPrefetch(  # type: ignore[attr-defined]
                principal_id=prefetch[0], key=prefetch[1], entry=replay_cache_entry_decode(got.pop(0))
            )
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait


def _replay_prefetch_target(request: Request, view: Any) -> tuple[str, str, str] | None:
    """(principal id, Idempotency-Key, Redis key) of the replay-cache entry a keyed POST to
    an internal-effect view will look up first, or None."""
    if request.method != "POST" or getattr(view, "idempotency_effect", None) != "internal":
        return None
    raw_key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    principal = request.user
    if raw_key is None or not isinstance(principal, Principal) or not idempotency_key_is_valid(raw_key):
        return None
    redis_key = replay_cache_redis_key(principal_id=principal.id, key=raw_key)
    return None if redis_key is None else (principal.id, raw_key, redis_key)


def _windows_count(
    limits: list[tuple[str, int, int]], *, now: float, get_keys: list[str] | None = None
) -> tuple[float | None, list[bytes | None]] | None:
    """Count a hit in the current window of each (key, limit, period) and GET `get_keys`, in
    ONE round trip (fastpath.counters): the longest wait of a window over its limit (None if
    none is), and the values got. None when Redis is down (fail open, and stop trying for a
    few seconds)."""
    global _redis_down_until
    windows = [(f"{key}:{int(now // period)}", period) for key, _, period in limits]
    answer = windows_count(windows, get_keys=get_keys or [])
    if answer is None:
        _redis_down_until = now + REDIS_BACKOFF_SECONDS
        logger.warning("throttle store unavailable: failing open")
        return None
    counts, got = answer
    waits = [(int(now // period) + 1) * period - now for (_, limit, period), count in zip(limits, counts, strict=True) if count > limit]
    return (max(waits) if waits else None), got


def api_key_epoch_now(request: Request) -> bytes | None:
    """The tenant's API key epoch as this request's throttle call read it; None if it
    did not (Redis down, or no key from the cache to check)."""
    value = getattr(request._request, "api_key_epoch_now", None)
    return value if isinstance(value, bytes) else None


def client_address(request: Request) -> str:
    """The client's address: REMOTE_ADDR, or behind `NUM_PROXIES` trusted proxies the
    address the outermost of them saw (X-Forwarded-For, read from the right as DRF does;
    what a client wrote further left is not trusted)."""
    remote = str(request.META.get("REMOTE_ADDR") or "-")
    proxies = api_settings.NUM_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    if not proxies or not forwarded:
        return remote
    hops = [hop.strip() for hop in str(forwarded).split(",") if hop.strip()]
    return hops[-min(int(proxies), len(hops))] if hops else remote


def auth_failure_wait_seconds(request: Request, *, key_prefix: str) -> float | None:
    """Count a failed authentication per client IP and per key prefix (rate "auth_failure",
    one Redis call only failures pay, so a flood of bad keys stops reaching the database);
    the seconds to wait when either is over, else None. Redis down: fails open."""
    rate = parse_rate(api_settings.DEFAULT_THROTTLE_RATES.get("auth_failure"))
    now = time.time()
    if rate is None or now < _redis_down_until:
        return None
    schema = getattr(connection, "schema_name", "public")  # one tenant's failures never throttle another's
    idents = (f"{schema}:ip:{client_address(request)}", f"{schema}:prefix:{key_prefix}")
    answer = _windows_count([(f"tally:throttle:auth_failure:{ident}", *rate) for ident in idents], now=now)
    return None if answer is None else answer[0]
