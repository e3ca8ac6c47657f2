"""The process's Redis client for the request path's own calls (throttles, API key epochs,
relay kicks): short timeouts, so a dead Redis costs a request at most a quarter of a
second before its caller falls back, and no retries (redis-py's retries with backoff
turned a refused port into 3.9 s). One client per process and `REDIS_URL`."""

from __future__ import annotations

import functools

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

TIMEOUT_SECONDS = 0.25


@functools.lru_cache(maxsize=1)
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS, retry=Retry(NoBackoff(), 0))


def fast_redis() -> redis.Redis:
    return _client_for(str(settings.REDIS_URL))
