"""Secrets Tally must use again, not only check, sealed at rest: one scheme for all of them.

A PSP's API key (payments/gateways/credentials.py), a stored answer that shows a secret
once (payments/idempotency/sealing.py) and a merchant's webhook signing secret
(webhooks/secrets.py) are each sealed with AES-256-GCM:

- the key is derived from SECRET_KEY for one purpose (HMAC-SHA256(SECRET_KEY, purpose)),
  so a value sealed for one purpose never opens as another;
- every value gets a fresh random 96-bit nonce;
- associated data names where the value belongs (tenant schema, row, field), so a sealed
  value copied to another row, field or tenant does not open;
- stored as `prefix + nonce + ciphertext and tag`; the prefix names the scheme and its
  version, so a new scheme is a new prefix read beside the old one.

A database dump alone opens nothing; SECRET_KEY opens everything (rotating it is not
supported: what was sealed under the old key would no longer open).
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
