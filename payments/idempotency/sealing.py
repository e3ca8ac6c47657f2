"""Encryption at rest for stored responses that carry a secret shown once.

Creating an API key, a webhook signing secret or a payment token answers with the
secret itself, and a byte-identical replay needs those bytes later. They are stored
sealed with AES-256-GCM under a key derived from SECRET_KEY, bound to the record's
(principal, key) as associated data so a sealed body cannot be replayed under another
record. A database dump alone reveals no secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

SEALED_PREFIX = b"tally-sealed:v1:"
_NONCE_BYTES = 12


def _key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode("utf-8"), b"tally/idempotency/response-seal/v1", hashlib.sha256).digest()


def _associated_data(principal_id: str, key: str) -> bytes:
    return f"{principal_id}\x00{key}".encode()


def response_body_seal(*, body: bytes, principal_id: str, key: str) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return SEALED_PREFIX + nonce + AESGCM(_key()).encrypt(nonce, body, _associated_data(principal_id, key))


def response_body_unseal(*, stored: bytes, principal_id: str, key: str) -> bytes:
    """The original bytes; bodies that were never sealed come back unchanged."""
    if not stored.startswith(SEALED_PREFIX):
        return stored
    sealed = stored[len(SEALED_PREFIX):]
    nonce, ciphertext = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
    return AESGCM(_key()).decrypt(nonce, ciphertext, _associated_data(principal_id, key))
