"""A kombu Redis channel whose connection is already torn down raises a connection error
instead of an AttributeError that kills the worker (docs/RELIABILITY.md, "Redis outages"):
closing a channel after `connection.collect()` built a pool from the detached transport, and
the close path ignores only connection errors (celery 5.7.0, kombu 5.7.0, redis-py 8.1.0;
same symptom: celery/kombu#582).
"""

from __future__ import annotations

from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis

_connparams = kombu_redis.Channel._connparams


def _connparams_of_a_connected_channel(self: kombu_redis.Channel, asynchronous: bool = False) -> dict[str, Any]:
    if self.connection.client is None:
        raise redis.exceptions.ConnectionError("the broker connection this channel belonged to is closed")
    params: dict[str, Any] = _connparams(self, asynchronous=asynchronous)  # type: ignore[no-untyped-call]  # kombu is untyped
    return params


def broker_channel_patch() -> None:
    """Install the check on kombu's Redis channel (the one the `redis`, `rediss` and
    `redis+socket` broker URLs use). Idempotent."""
    kombu_redis.Channel._connparams = _connparams_of_a_connected_channel  # type: ignore[method-assign]
