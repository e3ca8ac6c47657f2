"""Schemathesis hooks for the live run (tests/api/test_schemathesis_live.py), loaded by the
CLI through SCHEMATHESIS_HOOKS; the in-process run uses the same key rule."""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

# The same rule as idempotency.canonical (without importing Django here).
_VALID_KEY = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?")


def idempotency_key_refresh(headers: dict[str, Any]) -> dict[str, Any]:
    """A generated key that is valid is replaced by a fresh one: schemathesis repeats
    values, and the same key with another body is rightly a 422. An invalid or missing
    one (the negative phases) is sent as generated, to be refused."""
    given = headers.get("Idempotency-Key")
    if isinstance(given, str) and _VALID_KEY.fullmatch(given):
        headers["Idempotency-Key"] = uuid.uuid4().hex
    return headers


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    case.headers = idempotency_key_refresh(case.headers if case.headers is not None else {})
