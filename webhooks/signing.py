"""The `Tally-Signature` header (SPEC 8), like Stripe's: `t=<unix seconds>,v1=<hex>`, the hex
being HMAC-SHA256 under the endpoint's secret over `"<t>.<body>"`. During a secret
rotation's overlap there is one `v1=` per secret (newest first); a receiver accepts the
request if any of them matches its secret and `t` is within its tolerance (300 s)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

SIGNATURE_HEADER = "Tally-Signature"
TOLERANCE_SECONDS = 300


def signature_compute(*, secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(*, secrets: Sequence[str], timestamp: int, body: bytes) -> str:
    return ",".join([f"t={timestamp}", *(f"v1={signature_compute(secret=s, timestamp=timestamp, body=body)}" for s in secrets)])
