"""Stored responses that carry a secret shown once (an API key, a webhook signing secret, a
payment token) are sealed (wallets/sealing.py), bound to the record's (principal, key),
so a database dump reveals no secret and a sealed body replays under no other record.
A staff action's stored value ({"message", "secret_sealed"}, idempotency/staff.py)
holds its sealed secret in base64 inside JSON."""

from __future__ import annotations

import base64
import json

from idempotency.locks import idempotency_records_lock
from idempotency.models import IdempotencyRecord
from wallets.sealing import UNOPENED, ResealBatch, SealScheme, secret_is_sealed, secret_needs_reseal, secret_reseal, secret_seal, secret_unseal
from wallets.transactions import run_atomic

SCHEME = SealScheme(purpose=b"tally/idempotency/response-seal/v1", tag=b"tally-sealed")
_STAFF_FIELD = b'"secret_sealed"'
# What idempotency.staff gives a staff action's record.
STAFF_SCOPE_PREFIX = "admin:"
STAFF_PRINCIPAL_PREFIX = "user:"


def _associated_data(principal_id: str, key: str) -> bytes:
    return f"{principal_id}\x00{key}".encode()


def response_body_seal(*, body: bytes, principal_id: str, key: str) -> bytes:
    return secret_seal(scheme=SCHEME, plaintext=body, associated_data=_associated_data(principal_id, key))


def response_body_unseal(*, stored: bytes, principal_id: str, key: str) -> bytes:
    """The original bytes; bodies that were never sealed come back unchanged."""
    if not secret_is_sealed(scheme=SCHEME, stored=stored):
        return stored
    return secret_unseal(scheme=SCHEME, sealed=stored, associated_data=_associated_data(principal_id, key))


def _staff_record(scope: str, principal_id: str) -> bool:
    """Whether the record is a staff action's (idempotency.staff): only those store a
    sealed secret inside a JSON answer. An API answer may echo client input that looks like
    one (a store named `secret_sealed`), so the record, not its bytes, decides."""
    return scope.startswith(STAFF_SCOPE_PREFIX) and principal_id.startswith(STAFF_PRINCIPAL_PREFIX)


def _body_resealed(body: bytes, scope: str, principal_id: str, key: str) -> bytes | None:
    """The stored body with its sealed part under the ring's first key; None if nothing
    changes. Raises what does not open (UNOPENED, or a staff answer that is malformed)."""
    aad = _associated_data(principal_id, key)
    if secret_is_sealed(scheme=SCHEME, stored=body):
        return secret_reseal(scheme=SCHEME, sealed=body, associated_data=aad)
    if not _staff_record(scope, principal_id):
        return None
    value = json.loads(body)
    if not isinstance(value, dict) or "secret_sealed" not in value:
        return None  # a staff action that showed no secret
    inner = base64.b64decode(value["secret_sealed"], validate=True)
    new = secret_reseal(scheme=SCHEME, sealed=inner, associated_data=aad)
    if new is None:
        return None
    value["secret_sealed"] = base64.b64encode(new).decode("ascii")
    # As idempotency_run stores a value (sorted keys, no spaces).
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _needs_reseal(body: bytes, scope: str, principal_id: str, key: str) -> bool:
    if secret_is_sealed(scheme=SCHEME, stored=body):
        return secret_needs_reseal(scheme=SCHEME, sealed=body, associated_data=_associated_data(principal_id, key))
    return _staff_record(scope, principal_id) and _STAFF_FIELD in body


def idempotency_records_reseal(after: str = "", limit: int = 500) -> ResealBatch:
    """The stored answers of the next `limit` records after id `after` re-sealed under the
    ring's first key. Read unlocked to find the sealed ones; then, in one transaction, those
    are locked (idempotency_records_lock) and re-read, so a completion racing this writes
    what it writes and this one seals what is there."""
    rows = list(
        IdempotencyRecord.objects.filter(pk__gt=int(after or 0), response_body__isnull=False)
        .order_by("pk")
        .values_list("pk", "response_body", "scope", "principal_id", "key")[:limit]
    )
    candidates = [pk for pk, body, scope, principal_id, key in rows if body is not None and _needs_reseal(bytes(body), scope, principal_id, key)]

    def batch() -> tuple[int, list[str]]:
        resealed, unopened = 0, []
        for record in idempotency_records_lock(ids=candidates):
            if record.response_body is None:
                continue
            try:
                new = _body_resealed(bytes(record.response_body), record.scope, record.principal_id, record.key)
            except (*UNOPENED, KeyError, TypeError):  # binascii.Error and JSONDecodeError are ValueErrors
                unopened.append(str(record.pk))
                continue
            if new is not None:
                IdempotencyRecord.objects.filter(pk=record.pk).update(response_body=new)
                resealed += 1
        return resealed, unopened

    resealed, unopened = run_atomic(batch, operation="idempotency_records_reseal") if candidates else (0, [])
    return ResealBatch(cursor=str(rows[-1][0]) if len(rows) == limit else None, resealed=resealed, unopened=tuple(unopened))
