"""Every lock the webhooks app takes, named (see wallets/locks.py for the money locks).

Order: a relay takes at most one of these at a time, and never while holding a money lock;
the staff actions and the endpoint registration below take theirs alone.
- `outbox_events_claim`: a batch of unpublished outbox rows, FOR UPDATE SKIP LOCKED, in
  (created, id) order; held for the batch's short publication transaction only.
- `outbox_event_lock`: one outbox row (a dead letter requeued by staff).
- `webhook_delivery_lock`: one delivery row and its endpoint's row (a redelivery).
- `merchant_lock`: a merchant's row while an endpoint is registered (the per-merchant limit).
- `webhook_endpoint_lock` / `webhook_endpoint_rows_lock`: endpoint rows, FOR NO KEY UPDATE
  (a delivery's insert, which only needs the key, is not blocked), one row (secret
  rotation) or a batch in id order (the secret re-seal's backfill and contract); never
  held across an HTTP call.
- `endpoint_dispatch_lock`: a session advisory lock per endpoint, tried (never waited for)
  and held while that endpoint's due deliveries are sent one by one, so one endpoint
  gets its deliveries one at a time, in event order, whatever the number of relays. No
  row lock is held across an HTTP call; a relay that dies (even SIGKILL) drops its
  session, and PostgreSQL releases the advisory lock with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django.db import connection
from django.db.models import Q, QuerySet

from payments.models import OutboxEvent
from wallets.models import Merchant
from webhooks.models import WebhookDelivery, WebhookEndpoint


def outbox_events_claim(*, now: datetime, limit: int) -> QuerySet[OutboxEvent]:
    """Unpublished, live, due outbox rows in (created, id) order, locked; rows another relay
    holds are skipped (it publishes them)."""
    return (
        OutboxEvent.objects.select_for_update(skip_locked=True)
        .filter(published_at__isnull=True, dead_at__isnull=True)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .order_by("created", "id")[:limit]
    )


def outbox_event_lock(*, event_id: str) -> OutboxEvent:
    """One outbox row, FOR UPDATE (a requeue): taken alone, never with a money lock."""
    return OutboxEvent.objects.select_for_update().get(pk=event_id)


def webhook_delivery_lock(*, delivery_id: str) -> WebhookDelivery:
    """One delivery row and its endpoint's row, FOR UPDATE in one statement (a redelivery): taken alone."""
    return WebhookDelivery.objects.select_for_update().select_related("endpoint").get(pk=delivery_id)


def merchant_lock(*, merchant_id: str) -> Merchant | None:
    """A merchant's row, FOR UPDATE (an endpoint registration counts the merchant's endpoints): taken alone."""
    return Merchant.objects.select_for_update().filter(pk=merchant_id).first()


def webhook_endpoint_lock(*, endpoint_id: str) -> WebhookEndpoint:
    """The endpoint's row, locked."""
    return WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=endpoint_id)


def webhook_endpoint_rows_lock(*, after: str, limit: int, query: Q | None = None) -> list[WebhookEndpoint]:
    """The next `limit` endpoint rows after id `after` (matching `query`), in id order, locked."""
    rows = WebhookEndpoint.objects.filter(pk__gt=after)
    if query is not None:
        rows = rows.filter(query)
    return list(rows.order_by("pk").select_for_update(no_key=True)[:limit])


def _advisory_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def endpoint_dispatch_lock(*, endpoint_id: str) -> Iterator[bool]:
    """Try the endpoint's dispatch lock (per tenant schema); yields whether it was taken."""
    schema_name = getattr(connection, "schema_name", "public")
    key = _advisory_key(f"tally:webhook-dispatch:{schema_name}:{endpoint_id}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        row = cursor.fetchone()
    taken = bool(row and row[0])
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
