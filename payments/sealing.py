"""Secrets Tally must use again, not only check, sealed at rest with one scheme: PSP API
keys (gateways/credentials.py), stored answers that show a secret once
(idempotency/sealing.py) and merchants' webhook signing secrets (webhooks/secrets.py).

AES-256-GCM, a fresh 96-bit nonce per value, and associated data naming where the value
belongs (schema, row, field), so a copied value does not open. The keys are a ring of
their own, `settings.TALLY_SEALING_KEYS`, never derived from SECRET_KEY:

  TALLY_SEALING_KEYS = "<id>:<key>,<id>:<key>,..."

an id of 1 to 32 letters, digits, `_` or `-` (`legacy` is reserved), and a key of 32
random bytes in base64 (urlsafe or standard). The first key seals; every key opens. Per
purpose the AES key is HMAC-SHA256(ring key, purpose), so a value sealed for one purpose
never opens as another. Stored as

  <tag>:v2:<key id>:<nonce><ciphertext and tag>

so opening picks its key by id, without trial. Rotation: put a new key first in every
process, run `manage.py secrets_reseal` (every stored value re-sealed under it), then
drop the old key.

Values from older releases are `<tag>:v1:<nonce><ciphertext>` under HMAC(SECRET_KEY,
purpose). They open only while TALLY_SEALING_LEGACY_SECRET_KEY holds that old SECRET_KEY
(the ring's reserved id `legacy`, which never seals): the upgrade is set it, run
`secrets_reseal`, unset it. SECRET_KEY itself opens nothing.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

_NONCE_BYTES = 12
KEY_BYTES: Final = 32
LEGACY_ID: Final = "legacy"
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
KEY_GENERATE_HINT: Final = (
    "generate a key with: python -c \"import base64, os; print('k1:' + base64.urlsafe_b64encode(os.urandom(32)).decode())\" "
    "and set TALLY_SEALING_KEYS to what it prints (README.md, 'Sealing keys')"
)


class SealingRingInvalid(ValueError):
    """TALLY_SEALING_KEYS is missing or malformed (the message says what is wrong)."""


class SealingKeyUnknown(ValueError):
    """A sealed value names a key the ring does not hold (removed too early, or a legacy
    value without TALLY_SEALING_LEGACY_SECRET_KEY)."""


@dataclass(frozen=True)
class SealScheme:
    purpose: bytes  # what the key is derived for
    tag: bytes  # names the kind of value in front of every sealed value ("tally-gw")

    @property
    def legacy_prefix(self) -> bytes:
        return self.tag + b":v1:"

    @property
    def prefix(self) -> bytes:
        return self.tag + b":v2:"


@dataclass(frozen=True)
class SealingRing:
    primary: str
    keys: dict[str, bytes] = field(hash=False)  # id -> key material (the legacy one: the old SECRET_KEY's bytes)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Short and stable for this set of key ids in this order: it names caches of
        sealed values, so a changed ring never reads one sealed under a key it lost."""
        return hashlib.sha256(",".join(self.keys).encode()).hexdigest()[:12]


def sealing_ring_parse(entries: Sequence[str], *, legacy_secret_key: str = "") -> SealingRing:
    """The ring of `entries` (`id:base64-key`, first seals). SealingRingInvalid says why not."""
    keys: dict[str, bytes] = {}
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep or not _KEY_ID.match(key_id):
            raise SealingRingInvalid(f"TALLY_SEALING_KEYS entry {key_id[:32]!r}...: each entry is <id>:<base64 key>, id of 1-32 [A-Za-z0-9_-]")
        if key_id == LEGACY_ID:
            raise SealingRingInvalid("TALLY_SEALING_KEYS: the id 'legacy' is reserved (set TALLY_SEALING_LEGACY_SECRET_KEY instead)")
        if key_id in keys:
            raise SealingRingInvalid(f"TALLY_SEALING_KEYS: key id {key_id!r} appears twice")
        try:
            material = base64.b64decode(encoded.replace("-", "+").replace("_", "/") + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise SealingRingInvalid(f"TALLY_SEALING_KEYS: key {key_id!r} is not base64") from None
        if len(material) != KEY_BYTES:
            raise SealingRingInvalid(f"TALLY_SEALING_KEYS: key {key_id!r} is {len(material)} bytes, not {KEY_BYTES}")
        keys[key_id] = material
    if not keys:
        raise SealingRingInvalid("TALLY_SEALING_KEYS is not set: secrets cannot be sealed or opened")
    primary = next(iter(keys))
    if legacy_secret_key:
        keys[LEGACY_ID] = legacy_secret_key.encode("utf-8")
    return SealingRing(primary=primary, keys=keys)


@functools.lru_cache(maxsize=4)
def _ring_of(entries: tuple[str, ...], legacy_secret_key: str) -> SealingRing:
    return sealing_ring_parse(entries, legacy_secret_key=legacy_secret_key)


def sealing_ring() -> SealingRing:
    """The configured ring (parsed once per value of the settings)."""
    return _ring_of(tuple(settings.TALLY_SEALING_KEYS), str(settings.TALLY_SEALING_LEGACY_SECRET_KEY))


def sealing_ring_forget() -> None:
    """Drop every parsed ring and derived key (what a restart does)."""
    _ring_of.cache_clear()
    _aead.cache_clear()


@functools.lru_cache(maxsize=64)
def _aead(material: bytes, purpose: bytes) -> AESGCM:
    return AESGCM(hmac.new(material, purpose, hashlib.sha256).digest())


def secret_is_sealed(*, scheme: SealScheme, stored: bytes) -> bool:
    return stored.startswith(scheme.prefix) or stored.startswith(scheme.legacy_prefix)


def secret_key_id(*, scheme: SealScheme, stored: bytes) -> str:
    """The id of the key `stored` was sealed under (`legacy` for an older release's value).
    ValueError if it is not a value of this scheme."""
    if stored.startswith(scheme.legacy_prefix):
        return LEGACY_ID
    if not stored.startswith(scheme.prefix):
        raise ValueError("not a value sealed by this scheme")
    key_id, sep, _ = stored[len(scheme.prefix):len(scheme.prefix) + 33].partition(b":")
    if not sep:
        raise ValueError("sealed value without a key id")
    return key_id.decode("ascii", "replace")


def secret_seal(*, scheme: SealScheme, plaintext: bytes, associated_data: bytes) -> bytes:
    ring = sealing_ring()
    nonce = os.urandom(_NONCE_BYTES)
    sealed = _aead(ring.keys[ring.primary], scheme.purpose).encrypt(nonce, plaintext, associated_data)
    return scheme.prefix + ring.primary.encode("ascii") + b":" + nonce + sealed


def secret_unseal(*, scheme: SealScheme, sealed: bytes, associated_data: bytes) -> bytes:
    """The plaintext. ValueError if `sealed` is not of this scheme, SealingKeyUnknown (a
    ValueError) if its key is not in the ring; InvalidTag (cryptography) if it was sealed
    for other associated data or under another key of that id, or altered."""
    key_id = secret_key_id(scheme=scheme, stored=sealed)
    material = sealing_ring().keys.get(key_id)
    if material is None:
        if key_id == LEGACY_ID:
            raise SealingKeyUnknown("sealed by an older release: set TALLY_SEALING_LEGACY_SECRET_KEY, run secrets_reseal")
        raise SealingKeyUnknown(f"sealed under key {key_id!r}, which is not in TALLY_SEALING_KEYS")
    start = len(scheme.legacy_prefix) if key_id == LEGACY_ID else len(scheme.prefix) + len(key_id) + 1
    body = sealed[start:]
    nonce, ciphertext = body[:_NONCE_BYTES], body[_NONCE_BYTES:]
    return _aead(material, scheme.purpose).decrypt(nonce, ciphertext, associated_data)


def secret_reseal(*, scheme: SealScheme, sealed: bytes, associated_data: bytes) -> bytes | None:
    """`sealed` sealed again under the ring's first key, or None if it already is. Raises
    what secret_unseal raises for a value that does not open."""
    if secret_key_id(scheme=scheme, stored=sealed) == sealing_ring().primary:
        return None
    plaintext = secret_unseal(scheme=scheme, sealed=sealed, associated_data=associated_data)
    return secret_seal(scheme=scheme, plaintext=plaintext, associated_data=associated_data)


# --- Where sealed values are stored ---------------------------------------------------------
# Each app that stores sealed values registers a batch function here (from its AppConfig),
# so `manage.py secrets_reseal` covers every store without importing the apps above it.


# What a value that does not open raises: a key not in the ring, a malformed value (ValueError,
# binascii.Error, JSONDecodeError), or the wrong key or associated data (InvalidTag).
UNOPENED: Final = (ValueError, InvalidTag)


@dataclass(frozen=True)
class ResealBatch:
    cursor: str | None  # where the next batch starts; None: this tenant's store is done
    resealed: int  # rows rewritten (a row already under the first key is left as it is)
    unopened: tuple[str, ...] = ()  # ids of rows holding a value that does not open (left as they are)


ResealFn = Callable[[str, int], ResealBatch]  # (after, limit), in the current tenant's schema


@dataclass(frozen=True)
class SealedStore:
    name: str
    reseal_batch: ResealFn


_STORES: dict[str, SealedStore] = {}


def sealed_store_register(*, name: str, reseal_batch: ResealFn) -> None:
    _STORES[name] = SealedStore(name=name, reseal_batch=reseal_batch)


def sealed_stores() -> list[SealedStore]:
    return [_STORES[name] for name in sorted(_STORES)]
