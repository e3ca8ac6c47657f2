"""Secrets Tally must use again, not only check, sealed at rest with one scheme: PSP API
keys (gateways/credentials.py), stored answers that show a secret once
(idempotency/sealing.py) and merchants' webhook signing secrets (webhooks/secrets.py).

AES-256-GCM under a key derived from SECRET_KEY per purpose (a value sealed for one
purpose never opens as another), a fresh 96-bit nonce per value, and associated data
naming where the value belongs (schema, row, field), so a copied value does not open.
Stored as `prefix + nonce + ciphertext and tag`; the prefix names the scheme's version.
A database dump alone opens nothing; SECRET_KEY opens everything (rotating it is not
supported).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

_NONCE_BYTES = 12


@dataclass(frozen=True)
class SealScheme:
    purpose: bytes  # what the key is derived for
    prefix: bytes  # stored in front of every sealed value


def _key(scheme: SealScheme) -> bytes:
    return hmac.new(settings.SECRET_KEY.encode("utf-8"), scheme.purpose, hashlib.sha256).digest()


def secret_is_sealed(*, scheme: SealScheme, stored: bytes) -> bool:
    return stored.startswith(scheme.prefix)


def secret_seal(*, scheme: SealScheme, plaintext: bytes, associated_data: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return scheme.prefix + nonce + AESGCM(_key(scheme)).encrypt(nonce, plaintext, associated_data)


def secret_unseal(*, scheme: SealScheme, sealed: bytes, associated_data: bytes) -> bytes:
    """The plaintext. ValueError if `sealed` is not of this scheme; InvalidTag
    (cryptography) if it was sealed for other associated data or under another key, or
    altered."""
    if not secret_is_sealed(scheme=scheme, stored=sealed):
        raise ValueError("not a value sealed by this scheme")
    body = sealed[len(scheme.prefix):]
    nonce, ciphertext = body[:_NONCE_BYTES], body[_NONCE_BYTES:]
    return AESGCM(_key(scheme)).decrypt(nonce, ciphertext, associated_data)
