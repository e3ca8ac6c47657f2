"""Stored responses that carry a secret shown once (an API key, a webhook signing secret, a
payment token) are sealed (payments/sealing.py), bound to the record's (principal, key),
so a database dump reveals no secret and a sealed body replays under no other record."""

from __future__ import annotations

from payments.sealing import SealScheme, secret_is_sealed, secret_seal, secret_unseal

SCHEME = SealScheme(purpose=b"tally/idempotency/response-seal/v1", prefix=b"tally-sealed:v1:")


def _associated_data(principal_id: str, key: str) -> bytes:
    return f"{principal_id}\x00{key}".encode()


def response_body_seal(*, body: bytes, principal_id: str, key: str) -> bytes:
    return secret_seal(scheme=SCHEME, plaintext=body, associated_data=_associated_data(principal_id, key))


def response_body_unseal(*, stored: bytes, principal_id: str, key: str) -> bytes:
    """The original bytes; bodies that were never sealed come back unchanged."""
    if not secret_is_sealed(scheme=SCHEME, stored=stored):
        return stored
    return secret_unseal(scheme=SCHEME, sealed=stored, associated_data=_associated_data(principal_id, key))
