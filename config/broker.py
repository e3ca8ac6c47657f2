"""The Redis broker's channel, when its connection is already torn down, reports a
connection error instead of an AttributeError that kills the worker.

What happened (celery 5.7.0, kombu 5.7.0, redis-py 8.1.0; the newest on the index): a
Redis outage while tasks are delivered but not acknowledged (acks_late; a relay kick's
countdown holds its message in the worker) ends the worker with
`Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")`.
On the lost connection the consumer calls `connection.collect()`, then `connection.close()`
(celery.worker.consumer.Consumer.on_connection_error_after_connected). `collect()` tries to
close the default channel: its pending BRPOP read fails first, so the channel is left open,
and then detaches the transport (`transport.client = None`). `close()` tries that channel
again: the channel dropped its Redis pools, and restoring its unacknowledged messages asks
for a new pool, built from `self.connection.client.hostname`, on a transport whose client is
now None. `ignore_errors` around the close swallows only connection errors, so the
AttributeError escapes the consumer and the worker exits 1. The same symptom was reported
at close time before (celery/kombu#582); no kombu release changes this path.

A channel whose transport has no client cannot open a connection, whatever it wants one
for, so it raises redis-py's ConnectionError: one of the transport's connection errors, which
the close path already ignores, after which the consumer reconnects as it does after any
other connection error. The messages it could not restore stay in Redis's unacked set and
are delivered again after the visibility timeout (Redis keeping them) or were lost with
Redis; every Tally task is safe to run twice and beat's sweeps re-drive what a lost relay
kick or recovery run missed (docs/RELIABILITY.md).
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
