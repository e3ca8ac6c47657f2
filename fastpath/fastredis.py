"""The process's Redis client for the request path's own calls (throttles, API key epochs,
relay kicks): short timeouts, so a dead Redis costs a request at most a quarter of a
second before its caller falls back, and no retries (redis-py's retries with backoff
turned a refused port into 3.9 s). One client per process and `REDIS_URL`."""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

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
                client = redis.Redis.from_url(
                    url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS, retry=Retry(NoBackoff(), 0)
                )
                current = (url, client)
                _client = current
    return current[1]
