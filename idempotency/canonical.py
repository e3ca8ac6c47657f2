"""Idempotency-Key validation and the request fingerprint (SPEC 6).

Fingerprint: SHA-256 over ``("tally-idempotency-v1", METHOD, path, principal id, canonical
body)``, each part UTF-8 and prefixed by its byte length (8 bytes, big-endian), so no part
can bleed into the next. Canonical body: ``b""`` if empty or whitespace, ``b"json:"`` +
canonical JSON for a JSON document, else ``b"raw:"`` + the bytes. Canonical JSON: keys
sorted by code point, no whitespace, strings as ``json.dumps(ensure_ascii=False)`` writes
them (no Unicode normalisation), duplicate keys keep the last value (as the view's parser
does). Numbers by exact decimal value (``100``, ``1e2`` and ``100.00`` are ``100``; ``-0`` is
``0``), never rounded: positional when it fits in 64 digits either side of the point, else
``<mantissa>e<exponent>``, so a hostile ``1e999999999`` costs a few bytes. ``NaN`` and
``Infinity`` make the body ``raw:``.
"""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal
from typing import Any

FINGERPRINT_VERSION = b"tally-idempotency-v1"
KEY_MAX_LENGTH = 255
# Printable ASCII with no space at either end: HTTP strips a header value's outer
# whitespace (RFC 9110 5.5), so " k" and "k" would be one key on the wire and two in-process.
KEY_PATTERN = r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?"
_KEY_RE = re.compile(KEY_PATTERN)
_POSITIONAL_LIMIT = 64


def idempotency_key_is_valid(key: str) -> bool:
    """1 to 255 printable ASCII characters (0x20-0x7E), neither first nor last a space."""
    # fullmatch: "$" would let a trailing newline through.
    return bool(_KEY_RE.fullmatch(key))


def canonical_number(value: Decimal) -> str:
    sign, digit_tuple, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # NaN / Infinity: not reachable from JSON text
        raise ValueError("not a finite number")
    digits = "".join(str(d) for d in digit_tuple).lstrip("0")
    if not digits:
        return "0"
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    prefix = "-" if sign else ""
    if exponent >= 0 and len(digits) + exponent <= _POSITIONAL_LIMIT:
        return prefix + digits + "0" * exponent
    if exponent < 0 and -exponent <= _POSITIONAL_LIMIT and len(digits) + exponent <= _POSITIONAL_LIMIT:
        point = len(digits) + exponent
        if point > 0:
            return f"{prefix}{digits[:point]}.{digits[point:]}"
        return f"{prefix}0.{'0' * -point}{digits}"
    adjusted = exponent + len(digits) - 1
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{prefix}{mantissa}e{adjusted}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _canonical(value: Any, out: list[str]) -> None:
    if isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            out.append(("," if index else "") + json.dumps(key, ensure_ascii=False) + ":")
            _canonical(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _canonical(item, out)
        out.append("]")
    elif isinstance(value, str | bool) or value is None:
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, int | Decimal):
        out.append(canonical_number(Decimal(value)))
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__} (parse JSON numbers as Decimal, never float)")


def canonical_json(value: Any) -> str:
    """Canonical text of an already-parsed JSON value (floats are refused: parse with Decimal)."""
    out: list[str] = []
    _canonical(value, out)
    return "".join(out)


def canonical_body(body: bytes) -> bytes:
    if not body.strip():
        return b""
    try:  # every number kept exact (Decimal); NaN and Infinity refused
        text = canonical_json(json.loads(body, parse_float=Decimal, parse_int=Decimal, parse_constant=_reject_constant))
    except (ValueError, TypeError, RecursionError):
        return b"raw:" + body
    return b"json:" + text.encode("utf-8", "surrogatepass")


def fingerprint_compute(*, method: str, path: str, principal_id: str, body: bytes) -> str:
    """Hex SHA-256 fingerprint of a request (see the module docstring for the exact rule)."""
    digest = hashlib.sha256()
    for part in (
        FINGERPRINT_VERSION,
        method.upper().encode("ascii", "replace"),
        path.encode("utf-8", "surrogatepass"),
        principal_id.encode("utf-8", "surrogatepass"),
        canonical_body(body),
    ):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def fingerprint_of_value(*, scope: str, principal_id: str, payload: Any) -> str:
    """Fingerprint for non-HTTP callers (tasks, commands): method ``TASK``, path = scope."""
    body = canonical_json(payload).encode("utf-8", "surrogatepass")
    return fingerprint_compute(method="TASK", path=scope, principal_id=principal_id, body=body)
