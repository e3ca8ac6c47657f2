"""Reads of the idempotency layer. Call inside the tenant's schema."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.postgres.functions import TransactionNow
from django.db import connection
from django.db.models import Min, Q
from django.db.models.functions import Now

from idempotency.models import Effect, IdempotencyRecord, RecordState

# A snapshot's record, read with the database's clock: its transaction's start and now.
_SNAPSHOT_FIELDS = (
    "id", "fingerprint", "state", "fence", "request_id", "response_status", "response_headers", "response_body", "created",
    "completed_at", "lease_expires_at", "minted",
)


@dataclass(frozen=True)
class IdempotencyPolicy:
    wait_ms: int = 5000
    replay_window_seconds: int = 24 * 3600
    tombstone_window_seconds: int = 24 * 3600
    lease_seconds: int = 60


@dataclass(frozen=True)
class RecordSnapshot:
    """One record as read with the database clock (`now`), for window decisions."""

    id: int
    fingerprint: str
    state: str
    fence: int
    request_id: str
    response_status: int | None
    response_headers: dict[str, str]
    response_body: bytes | None
    created: datetime
    completed_at: datetime | None
    lease_expires_at: datetime | None
    minted: dict[str, str]
    transaction_started: datetime
    now: datetime

    def phase(self, policy: IdempotencyPolicy) -> str:
        age = self.now - self.created
        if age < timedelta(seconds=policy.replay_window_seconds):
            return "replay"
        if age < timedelta(seconds=policy.replay_window_seconds + policy.tombstone_window_seconds):
            return "tombstone"
        return "expired"

    @property
    def lease_expired(self) -> bool:
        return self.state == RecordState.IN_FLIGHT and self.lease_expires_at is not None and self.lease_expires_at <= self.now


def str_dict_of(value: Any) -> dict[str, str]:
    """A record's jsonb object (minted ids, stored headers) as a dict of strings."""
    return {str(k): str(v) for k, v in dict(value or {}).items()}


def idempotency_record_snapshot(*, principal_id: str, key: str) -> RecordSnapshot | None:
    row = (
        IdempotencyRecord.objects.filter(principal_id=principal_id, key=key).order_by()
        .values_list(*_SNAPSHOT_FIELDS, TransactionNow(), Now()).first()
    )
    if row is None:
        return None
    (record_id, fingerprint, state, fence, request_id, status, headers, body, created, completed_at, lease_expires_at, minted,
     transaction_started, now) = row
    return RecordSnapshot(
        id=int(record_id), fingerprint=str(fingerprint), state=str(state), fence=int(fence), request_id=str(request_id),
        response_status=None if status is None else int(status), response_headers=str_dict_of(headers),
        response_body=None if body is None else bytes(body), created=created, completed_at=completed_at,
        lease_expires_at=lease_expires_at, minted=str_dict_of(minted), transaction_started=transaction_started, now=now,
    )


def idempotency_record_get(*, principal_id: str, key: str) -> IdempotencyRecord | None:
    return IdempotencyRecord.objects.filter(principal_id=principal_id, key=key).first()


def idempotency_policy_get(*, tenant: Any | None = None) -> IdempotencyPolicy:
    """The policy of `tenant`, else of the connection's; in a task or `schema_context` that
    is a stand-in without the settings columns, so the row is read from the public table."""
    candidate = tenant if tenant is not None else getattr(connection, "tenant", None)
    if candidate is None or not hasattr(candidate, "idempotency_wait_ms"):
        from tenants.models import Tenant

        candidate = Tenant.objects.filter(schema_name=getattr(connection, "schema_name", None)).first()
        if candidate is None:
            return IdempotencyPolicy()
    return IdempotencyPolicy(
        wait_ms=int(candidate.idempotency_wait_ms),
        replay_window_seconds=int(candidate.idempotency_replay_window_seconds),
        tombstone_window_seconds=int(candidate.idempotency_tombstone_window_seconds),
    )


def idempotency_orphans_list(
    *, limit: int = 100, after: tuple[datetime, int] | None = None, expired_by: datetime | None = None
) -> list[IdempotencyRecord]:
    """One page of in-flight records whose lease expired, in (lease_expires_at, id) order after
    `after` (the previous page's last). `expired_by` (a pass's start): a record the pass took
    over itself, whose new lease ran out meanwhile, is not met again."""
    records = IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, lease_expires_at__lte=Now())
    if expired_by is not None:
        records = records.filter(lease_expires_at__lte=expired_by)
    if after is not None:
        records = records.filter(Q(lease_expires_at__gt=after[0]) | Q(lease_expires_at=after[0], id__gt=after[1]))
    return list(records.order_by("lease_expires_at", "id")[:limit])


def idempotency_external_lease_next_end() -> datetime | None:
    """The earliest lease end of an in-flight record of an external effect (a card
    top-up's claim): when the recovery may next have one to take over."""
    due: datetime | None = IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, effect=Effect.EXTERNAL).aggregate(
        due=Min("lease_expires_at")
    )["due"]
    return due


def idempotency_stuck_count() -> int:
    return IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, lease_expires_at__lte=Now()).count()
