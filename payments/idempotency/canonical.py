"""Idempotency-Key validation and the request fingerprint (SPEC 6).

Fingerprint = SHA-256 over a length-prefixed frame of
``("tally-idempotency-v1", METHOD, path, principal id, canonical body)``; each part is
UTF-8, prefixed by its byte length as 8 big-endian bytes, so no part can bleed into the
next (a path ending in the principal's first letters is still a different frame).

Canonical body (what "the same request" means):

- empty or whitespace-only body: ``b""``;
- a JSON document: ``b"json:"`` + canonical JSON (below);
- anything that is not JSON (the view will answer 400 anyway): ``b"raw:"`` + the bytes.

Canonical JSON: objects with keys sorted by Unicode code point, no whitespace,
separators ``,`` and ``:``; strings as Python's ``json.dumps(ensure_ascii=False)``
writes them (so ``"\\u00e9"`` and ``"é"`` are the same; no Unicode normalisation: NFC
and NFD spellings differ); ``true``/``false``/``null`` as is; duplicate keys keep the
last value (what the JSON parser of the view sees too).

Numbers are compared by exact decimal value: ``100``, ``100.0``, ``1e2``, ``1E+2`` and
``100.00`` are all ``100``; ``-0`` and ``0.0`` are ``0``; ``1.50`` is ``1.5``. A value
whose positional form fits in 64 digits either side of the point is written
positionally (``0.001``, ``-12.5``); anything larger or smaller is written as
``<mantissa>e<exponent>`` with a normalised mantissa (``1e100``, ``1.5e-70``), so a
hostile ``1e999999999`` costs a few bytes, not a gigabyte. Values are never rounded
(no float, no Decimal context precision is involved). ``NaN``/``Infinity`` are not
JSON and make the body ``raw:``.
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
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _canonical(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _canonical(item, out)
        out.append("]")
    elif isinstance(value, bool) or value is None:
        out.append(json.dumps(value))
    elif isinstance(value, Decimal):
        out.append(canonical_number(value))
    elif isinstance(value, int):
        out.append(canonical_number(Decimal(value)))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """Canonical text of an already-parsed JSON value (floats are refused: parse with Decimal)."""
    if isinstance(value, float):
        raise TypeError("floats are not canonical: parse JSON numbers as Decimal")
    out: list[str] = []
    _canonical(value, out)
    return "".join(out)


def json_loads_exact(text: str | bytes) -> Any:
    """Parse JSON keeping every number exact (Decimal), refusing NaN and Infinity."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal, parse_constant=_reject_constant)


def canonical_body(body: bytes) -> bytes:
    if not body.strip():
        return b""
    try:
        parsed = json_loads_exact(body)
        text = canonical_json(parsed)
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
