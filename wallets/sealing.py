"""Secrets Tally must use again, not only check, sealed at rest with one scheme: PSP API
keys (payments/gateways/credentials.py), stored answers that show a secret once
(idempotency/sealing.py) and merchants' webhook signing secrets (webhooks/secrets.py).

AES-256-GCM, a fresh 96-bit nonce per value, and associated data naming where the value
belongs (schema, row, field), so a copied value does not open. The keys are a ring of
their own, `TALLY_SEALING_KEYS = "<id>:<base64 of 32 bytes>,..."`, never derived from
SECRET_KEY: the first seals, every key opens. Per purpose the AES key is
HMAC-SHA256(ring key, purpose), so a value sealed for one purpose never opens as another.
Stored as `<tag>:v2:<key id>:<nonce><ciphertext and tag>`: opening picks its key by id,
and the header is bound into the associated data, so a relabelled value does not open.
Older releases' `<tag>:v1:` values (under HMAC(SECRET_KEY, purpose)) open only while
TALLY_SEALING_LEGACY_SECRET_KEY holds that old key (the ring's reserved id `legacy`, which
never seals). Rotation and that upgrade: README, "Sealing keys".
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
from django.views.decorators.debug import sensitive_variables

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
    """A sealed value names a key the ring does not hold (removed too early, or legacy)."""


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
    # id -> key material (the legacy one: the old SECRET_KEY's bytes); never in a repr.
    keys: dict[str, bytes] = field(hash=False, repr=False)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Stable for these ids and materials in this order: it names caches of sealed values,
        so a changed ring (even a key regenerated under its id) never reads a lost key's."""
        digest = hashlib.sha256()
        for key_id, material in self.keys.items():
            digest.update(key_id.encode() + b"\x00" + hashlib.sha256(material).digest())
        return digest.hexdigest()[:12]


@sensitive_variables("entries", "encoded", "material", "keys", "legacy_secret_key", "raw", "entry")
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
@sensitive_variables("material")
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
    decoded = key_id.decode("ascii", "replace")
    if not _KEY_ID.match(decoded) or decoded == LEGACY_ID:  # `legacy` names v1 values only
        raise ValueError(f"sealed value with an invalid key id {decoded[:32]!r}")
    return decoded


def _header(scheme: SealScheme, key_id: str) -> bytes:
    """`<tag>:v2:<key id>:`, which ends at its first `:` after `v2` (an id holds none)."""
    return scheme.prefix + key_id.encode("ascii") + b":"


@sensitive_variables("ring", "material")
def secret_seal(*, scheme: SealScheme, plaintext: bytes, associated_data: bytes) -> bytes:
    ring = sealing_ring()
    header = _header(scheme, ring.primary)
    nonce = os.urandom(_NONCE_BYTES)
    material = ring.keys[ring.primary]
    # The header is associated data too: a value whose key id was swapped does not open.
    sealed = _aead(material, scheme.purpose).encrypt(nonce, plaintext, header + associated_data)
    return header + nonce + sealed


@sensitive_variables("material")
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
    if key_id == LEGACY_ID:
        header, aad = scheme.legacy_prefix, associated_data  # as older releases sealed them
    else:
        header = _header(scheme, key_id)
        aad = header + associated_data
    body = sealed[len(header):]
    nonce, ciphertext = body[:_NONCE_BYTES], body[_NONCE_BYTES:]
    return _aead(material, scheme.purpose).decrypt(nonce, ciphertext, aad)


def secret_reseal(*, scheme: SealScheme, sealed: bytes, associated_data: bytes) -> bytes | None:
    """`sealed` sealed again under the ring's first key, or None if it already is. Raises what
    secret_unseal raises for a value that does not open, even under the first key's id."""
    if secret_key_id(scheme=scheme, stored=sealed) == sealing_ring().primary:
        secret_unseal(scheme=scheme, sealed=sealed, associated_data=associated_data)
        return None
    plaintext = secret_unseal(scheme=scheme, sealed=sealed, associated_data=associated_data)
    return secret_seal(scheme=scheme, plaintext=plaintext, associated_data=associated_data)


# What a value that does not open raises: a key not in the ring, a malformed value (ValueError,
# binascii.Error, JSONDecodeError), or the wrong key or associated data (InvalidTag).
UNOPENED: Final = (ValueError, InvalidTag)


def secret_needs_reseal(*, scheme: SealScheme, sealed: bytes, associated_data: bytes) -> bool:
    """Whether a reseal batch must take `sealed` (and report it if it does not open): not
    under the first key, malformed, or under the first key's id without opening with it."""
    try:
        if secret_key_id(scheme=scheme, stored=sealed) != sealing_ring().primary:
            return True
        secret_unseal(scheme=scheme, sealed=sealed, associated_data=associated_data)
    except UNOPENED:
        return True
    return False


# Each app that stores sealed values registers its reseal batch here (from its AppConfig),
# so `manage.py secrets_reseal` covers every store without importing the apps above it.


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
