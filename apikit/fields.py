"""Strict request fields shared by the faces: money, asset codes and object references."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from wallets.errors import AmountInvalid
from wallets.money import MAX_AMOUNT, amount_to_minor
from wallets.selectors import asset_exists

ASSET_CODE_RE = re.compile(r"^[A-Z][A-Z0-9_]{1,11}$")
# An object id (`cus_...`): in request bodies (ObjectIdField) and as the routers' lookup.
OBJECT_ID_PATTERN = r"[a-z]{2,4}_[A-Za-z0-9]{1,40}"


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_AMOUNT})
class AmountField(serializers.Field[int, int, int, Any]):
    """A positive integer in the asset's minor unit (SPEC 2). Floats (even 10.0), numeric
    strings, booleans, zero and negatives are refused: guessing moves the wrong amount."""

    default_error_messages = {
        "invalid": "must be a positive integer in the asset's minor unit (no fraction, no string)",
        "too_large": f"must be at most {MAX_AMOUNT}",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "Positive integer in the asset's minor unit (e.g. 1000 JPY, 1050 = 10.50 EUR).")
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        # Floats first: amount_to_minor treats one as a bug (TypeError); here it is client input.
        if isinstance(data, float | bool) or not isinstance(data, int):
            raise serializers.ValidationError(self.error_messages["invalid"], code="amount_invalid")
        if data > MAX_AMOUNT:
            raise serializers.ValidationError(self.error_messages["too_large"], code="amount_invalid")
        try:
            return amount_to_minor(data, param=self.field_name or "amount")
        except AmountInvalid:
            raise serializers.ValidationError(self.error_messages["invalid"], code="amount_invalid") from None

    def to_representation(self, value: int) -> int:
        return int(value)


class InstantFilterField(serializers.DateTimeField):
    """A bound of a time filter (`created_gte`, `created_lt`): any ISO 8601 date-time, as the
    schema's `date-time` says, returned in UTC. An instant that falls outside the years 1 to
    9999 once in UTC (year 1 with a positive offset, 9999 with a negative one) is clamped to
    the first or last representable instant: every row lies between them, so the filter
    selects the same rows (none before the first, all before the last)."""

    FIRST = datetime.min.replace(tzinfo=UTC)
    LAST = datetime.max.replace(tzinfo=UTC)

    def enforce_timezone(self, value: datetime) -> datetime:
        if value.tzinfo is not None and value.utcoffset() is not None:
            try:
                return value.astimezone(UTC)
            except OverflowError:
                return self.FIRST if value.year == 1 else self.LAST
        return super().enforce_timezone(value)


class AssetField(serializers.RegexField):
    def __init__(self, *, kinds: tuple[str, ...] | None = None, **kwargs: Any) -> None:
        self.kinds = kinds  # the asset kinds this field takes (None: any); the schema lists their codes
        kwargs.setdefault("help_text", "Asset code, e.g. JPY, POINT, CARBON.")
        super().__init__(ASSET_CODE_RE, max_length=12, error_messages={"invalid": "unknown asset code"}, **kwargs)


class AssetFilterField(AssetField):
    """An asset filter on a list: a code this tenant lacks is 400 `asset_unknown`, as on a
    write, not an empty page (writes, the hot path, look the asset up in the ledger's query)."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        code = super().run_validation(data)  # the code's pattern first: it may hold any byte
        if code is not None and not asset_exists(asset_code=code):
            raise serializers.ValidationError("unknown asset code", code="asset_unknown")
        return code


class ObjectIdField(serializers.RegexField):
    """A reference to an object by its prefixed id (`cus_...`); existence and ownership are
    checked by the selector the view calls (another principal's object -> 404)."""

    def __init__(self, prefix: str, **kwargs: Any) -> None:
        self.prefix = prefix
        kwargs.setdefault("help_text", f"Id of the object (`{prefix}_...`).")
        pattern = re.compile(rf"^{re.escape(prefix)}_[A-Za-z0-9]{{1,40}}$")  # OBJECT_ID_PATTERN with this type's prefix
        super().__init__(pattern, max_length=48, error_messages={"invalid": f"must be an id starting with {prefix}_"}, **kwargs)


# Free text as the schema states it: no NUL character (DRF refuses them), and, unless blank
# is allowed, something besides whitespace (DRF trims it with str.strip(), then refuses an
# empty value). The whitespace is spelled out, not `\s`: engines disagree on `\s` (Python's
# takes U+001C..U+001F, which str.strip() trims and ECMA 262's, the schema's, does not; ECMA's
# takes U+FEFF, which str.strip() keeps), so " \u001d" read as valid by a client was refused.
# Every character str.isspace() holds (tests/api/test_schema_constraints.py checks the list).
WHITESPACE_CLASS = "\\t\\n\\x0b\\x0c\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
TEXT_PATTERN = r"^[^\x00]*$"
NON_BLANK_TEXT_PATTERN = rf"^[{WHITESPACE_CLASS}]*[^{WHITESPACE_CLASS}\x00][^\x00]*$"


class TextField(serializers.CharField):
    """Free text: bounded as sent (before DRF trims surrounding whitespace, so the schema's
    maxLength is the rule), trimmed, no NUL; its schema states the pattern."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, str) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return str(super().to_internal_value(data))


def strict_char(**kwargs: Any) -> serializers.CharField:
    """Free text: bounded, trimmed; NUL characters refused."""
    kwargs.setdefault("max_length", 200)
    return TextField(**kwargs)


class ConstField(serializers.Field[Any, Any, Any, Any]):
    """The `object` discriminator of every response object."""

    def __init__(self, value: str, **kwargs: Any) -> None:
        self.value = value
        super().__init__(read_only=True, source="*", **kwargs)

    def to_representation(self, value: Any) -> str:
        return self.value
