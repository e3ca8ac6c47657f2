"""The `Tally-Signature` header (SPEC 8; docs/WEBHOOKS.md "A delivery"), Stripe's scheme as the PSPs' (payments.gateways.signing)."""

from __future__ import annotations

from collections.abc import Sequence

from payments.gateways.signing import signature_compute

SIGNATURE_HEADER = "Tally-Signature"


def signature_header(*, secrets: Sequence[str], timestamp: int, body: bytes) -> str:
    return ",".join([f"t={timestamp}", *(f"v1={signature_compute(secret=s, timestamp=timestamp, body=body)}" for s in secrets)])
