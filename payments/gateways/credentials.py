"""A tenant's gateway credentials, sealed at rest with AES-256-GCM (the scheme of
payments/idempotency/sealing.py, under its own derived key), bound by associated data to
the tenant schema, the gateway and the field, so a sealed value copied elsewhere does not open."""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

SEALED_PREFIX = b"tally-gw:v1:"
_NONCE_BYTES = 12


def _key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode("utf-8"), b"tally/gateways/credentials/v1", hashlib.sha256).digest()


def _aad(schema: str, gateway: str, field: str) -> bytes:
    return f"{schema}\x00{gateway}\x00{field}".encode()


def credential_seal(*, value: str, schema: str, gateway: str, field: str) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return SEALED_PREFIX + nonce + AESGCM(_key()).encrypt(nonce, value.encode("utf-8"), _aad(schema, gateway, field))


def credential_unseal(*, sealed: bytes, schema: str, gateway: str, field: str) -> str:
    if not sealed.startswith(SEALED_PREFIX):
        raise ValueError("not a sealed credential")
    body = sealed[len(SEALED_PREFIX):]
    nonce, ciphertext = body[:_NONCE_BYTES], body[_NONCE_BYTES:]
    return AESGCM(_key()).decrypt(nonce, ciphertext, _aad(schema, gateway, field)).decode("utf-8")
