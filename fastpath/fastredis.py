"""The process's Redis client for the request path's own calls (the throttles' script,
API key epochs, relay kicks): short timeouts, so a slow or dead Redis costs a request at
most a quarter of a second before its caller falls back. No retries: each caller has its
own fallback, and redis-py's retries with backoff would turn a quarter of a second into
seconds (its `Redis(host=...)` constructor retries with backoff by default: a refused
port took 3.9 s). One client per process and `REDIS_URL` (a changed URL, as in tests with
a private redis-server, gets a new one)."""

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
