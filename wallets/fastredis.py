"""The process's Redis client for the request path's own calls (the throttles' script,
API key epochs, relay kicks): short timeouts, so a slow or dead Redis costs a request at
most a quarter of a second before its caller falls back. One client per process and
`REDIS_URL` (a changed URL, as in tests with a private redis-server, gets a new one)."""

from __future__ import annotations

import threading

import redis
from django.conf import settings

TIMEOUT_SECONDS = 0.25

_lock = threading.Lock()
_client: tuple[str, redis.Redis] | None = None


def fast_redis() -> redis.Redis:
    global _client
    url = str(settings.REDIS_URL)
    current = _client
    if current is None or current[0] != url:
        with _lock:
            current = _client
            if current is None or current[0] != url:
                current = (url, redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS))
                _client = current
    return current[1]
