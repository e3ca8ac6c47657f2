"""The idempotency engine's door to fastpath/: the claim and the completion of every keyed
request go prepared, and completed answers are cached in Redis under this process's sealing
ring: an entry may hold a sealed body, so a process reads entries of its own ring only."""

from __future__ import annotations

import json

from django.db import connection
from django.db.models.functions import Now

from fastpath import replaycache
from fastpath.compiled import CompiledQuery, Param
from fastpath.prepared import prepared_statement_register
from fastpath.replaycache import CachedResponse, ReplayPrefetch
from idempotency.models import IdempotencyRecord, RecordState
from wallets.sealing import sealing_ring

# The cache's entry types, for the engine and the DRF mixin (business code never imports fastpath).
__all__ = [
    "CachedResponse", "ReplayPrefetch", "claim_insert", "completion_store", "replay_cache_clear", "replay_cache_get", "replay_cache_redis_key",
    "replay_cache_set",
]

# The claim says what the ORM cannot in one round trip: INSERT .. ON CONFLICT DO NOTHING
# RETURNING id, with the wait on a concurrent uncommitted claim of the key bounded by
# lock_timeout (set_config in a MATERIALIZED CTE runs before the INSERT tries its row).
CLAIM_SQL = prepared_statement_register("""
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true) AS lock_timeout)
INSERT INTO idempotency_record
    (principal_id, "key", scope, effect, fingerprint, state, fence, lease_expires_at,
     request_id, method, path, minted, created, updated)
SELECT %s, %s, %s, %s, %s, 'in_flight', 1, clock_timestamp() + make_interval(secs => %s::double precision),
       %s, %s, %s, '{}'::jsonb, clock_timestamp(), clock_timestamp()
FROM cfg
ON CONFLICT (principal_id, "key") DO NOTHING
RETURNING id
""")

# The fenced completion: the record stores its answer only while in flight under our fence.
COMPLETION = CompiledQuery(
    IdempotencyRecord.objects.filter(id=Param("record_id"), fence=Param("fence"), state=RecordState.IN_FLIGHT),
    update={
        "state": RecordState.COMPLETED, "response_status": Param("status"), "response_headers": Param("headers"),
        "response_body": Param("body"), "minted": Param("minted"), "request_id": Param("request_id"),
        "completed_at": Now(), "updated": Now(), "lease_expires_at": None,
    },
    prepared=True,
)


def claim_insert(
    *, lock_timeout: str, principal_id: str, key: str, scope: str, effect: str, fingerprint: str, lease_seconds: int,
    request_id: str, method: str, path: str,
) -> int | None:
    """Insert the in-flight record (fence 1) in the open transaction; its id, or None if the
    key is taken. Waits on an uncommitted claim of the key at most `lock_timeout` (55P03)."""
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_SQL, [lock_timeout, principal_id, key, scope, effect, fingerprint, lease_seconds, request_id, method, path])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def completion_store(
    *, record_id: int, fence: int, status: int, headers: dict[str, str], body: bytes, minted: dict[str, str], request_id: str
) -> bool:
    stored = COMPLETION.update(
        record_id=record_id, fence=fence, status=status, headers=json.dumps(headers, sort_keys=True), body=body,
        minted=json.dumps(minted, sort_keys=True), request_id=request_id,
    )
    return stored == 1


def _namespace() -> str:
    return sealing_ring().fingerprint


def replay_cache_redis_key(*, principal_id: str, key: str) -> str | None:
    return replaycache.replay_cache_redis_key(namespace=_namespace(), principal_id=principal_id, key=key)


def replay_cache_get(*, principal_id: str, key: str) -> CachedResponse | None:
    return replaycache.replay_cache_get(namespace=_namespace(), principal_id=principal_id, key=key)


def replay_cache_set(*, principal_id: str, key: str, entry: CachedResponse) -> None:
    replaycache.replay_cache_set(namespace=_namespace(), principal_id=principal_id, key=key, entry=entry)


def replay_cache_clear() -> int | None:
    return replaycache.replay_cache_clear()
