"""The request path's Redis client gives up within its timeout: a Redis that refuses or
never answers costs a caller one timeout, not redis-py's retries with backoff."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fastpath.fastredis import TIMEOUT_SECONDS, fast_redis

# One timeout, plus slack for a loaded machine; redis-py's default retries take seconds.
_BOUND_SECONDS = TIMEOUT_SECONDS + 0.5


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener completes the TCP handshake (the kernel's backlog does) and
    never answers a command."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


@pytest.fixture
def refused_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()  # bound and closed, never listened: a connect is refused
    return port


def _seconds_to_fail(settings: Any, port: int) -> float:
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    started = time.monotonic()
    with pytest.raises(redis.RedisError):
        fast_redis().incr("fast-redis-probe")
    return time.monotonic() - started


def test_a_redis_that_never_answers_costs_one_timeout(settings: Any, silent_port: int) -> None:
    assert _seconds_to_fail(settings, silent_port) < _BOUND_SECONDS


def test_a_redis_that_refuses_fails_at_once(settings: Any, refused_port: int) -> None:
    assert _seconds_to_fail(settings, refused_port) < _BOUND_SECONDS


def test_a_new_url_gets_its_own_client(settings: Any, refused_port: int) -> None:
    working = fast_redis()
    settings.REDIS_URL = f"redis://127.0.0.1:{refused_port}/0"
    assert fast_redis() is not working
