"""Inbound webhook signatures: `t=<unix seconds>,v1=<hex HMAC-SHA256 over "t.body">`
(Stripe's scheme, which the simulator also uses). Several secrets may be valid at once
(rotation); every `v1` in the header is tried against every secret, in constant time."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

TOLERANCE_SECONDS = 300


class SignatureInvalid(Exception):
    """Missing, malformed, or matching none of the secrets."""


class SignatureStale(Exception):
    """The signed timestamp is further than the tolerance from now."""


def signature_compute(*, secret: str, body: bytes, timestamp: int) -> str:
    return hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_verify(*, header: str | None, body: bytes, secrets: Sequence[str], now: float, tolerance: int = TOLERANCE_SECONDS) -> None:
    """Raise SignatureInvalid / SignatureStale unless `header` signs `body` with one of
    `secrets` within `tolerance` seconds of `now`."""
    if not header or not secrets:
        raise SignatureInvalid("no signature")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureInvalid("malformed signature header")
    matched = False
    for secret in secrets:
        expected = signature_compute(secret=secret, body=body, timestamp=timestamp)
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureInvalid("signature matches no secret")
    if abs(now - timestamp) > tolerance:
        raise SignatureStale("signature timestamp outside the tolerance")
