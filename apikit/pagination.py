"""Cursor pagination: `{object: "list", data, next_cursor}`, newest first. The cursor,
`<created, microseconds since 1970>.<id>`, is a position after the last row: stable under
inserts and O(limit) at any depth. Every string of that form is a position, so the schema's
pattern is the whole rule: anything else is 400 `cursor_invalid`."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.core.validators import RegexValidator
from django.db.models import Model, Q, QuerySet
from rest_framework import serializers

from apikit.fields import InstantFilterField
from apikit.shapes import Serializer

# Microseconds since 1970 (16 digits reach the year 2286), a dot, the row's id: digits for
# an integer key (18 fit a bigint), else a string id's characters.
CURSOR_PATTERN = r"^[0-9]{1,16}\.[A-Za-z0-9_]{1,64}$"
CURSOR_MAX_LENGTH = 81
_CURSOR_RE = re.compile(r"([0-9]{1,16})\.([A-Za-z0-9_]{1,64})")
_INT_PK_RE = re.compile(r"[0-9]{1,18}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100

M = TypeVar("M", bound=Model)


class ListParamsSerializer(Serializer):
    """Query parameters shared by every list endpoint."""

    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=10**6, help_text=f"Page size, default {DEFAULT_PAGE_SIZE}, capped at {MAX_PAGE_SIZE}."
    )
    cursor = serializers.CharField(
        required=False,
        max_length=CURSOR_MAX_LENGTH,
        validators=[RegexValidator(CURSOR_PATTERN, message="invalid cursor", code="cursor_invalid")],
        help_text=(
            "Opaque: the `next_cursor` of the previous page, passed back unchanged. "
            "A value not of the documented form is refused (400 `cursor_invalid`)."
        ),
    )
    created_gte = InstantFilterField(required=False, help_text="Only objects created at or after this time (ISO 8601).")
    created_gt = InstantFilterField(required=False, help_text="Only objects created after this time (ISO 8601).")
    created_lte = InstantFilterField(required=False, help_text="Only objects created at or before this time (ISO 8601).")
    created_lt = InstantFilterField(required=False, help_text="Only objects created before this time (ISO 8601).")


def page(
    queryset: QuerySet[M],
    params: dict[str, Any],
    render: Callable[[Sequence[M]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """One page of `queryset` (any model with `created` and a string pk), rendered."""
    limit = min(int(params.get("limit") or DEFAULT_PAGE_SIZE), MAX_PAGE_SIZE)
    qs = queryset
    for bound in ("gte", "gt", "lte", "lt"):
        if params.get(f"created_{bound}") is not None:
            qs = qs.filter(**{f"created__{bound}": params[f"created_{bound}"]})
    if params.get("cursor"):
        match = _CURSOR_RE.fullmatch(params["cursor"])
        if match is None:
            raise serializers.ValidationError({"cursor": [serializers.ErrorDetail("invalid cursor", code="cursor_invalid")]})
        micros, raw_pk = match.groups()
        created = _EPOCH + timedelta(microseconds=int(micros))
        pk: str | int = int(raw_pk) if _INT_PK_RE.fullmatch(raw_pk) else raw_pk
        pk_field = queryset.model._meta.pk
        int_pk = pk_field is not None and pk_field.get_internal_type() in {"AutoField", "BigAutoField"}
        if isinstance(pk, int) == int_pk:
            qs = qs.filter(Q(created__lt=created) | Q(created=created, pk__lt=pk))
        else:  # an id of the other kind (another list's cursor): integer ids sort before string ids
            qs = qs.filter(created__lte=created) if int_pk else qs.filter(created__lt=created)
    rows = list(qs.order_by("-created", "-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and rows:
        next_cursor = f"{(rows[-1].created - _EPOCH) // timedelta(microseconds=1)}.{rows[-1].pk}"  # type: ignore[attr-defined]
    return {"object": "list", "data": render(rows), "next_cursor": next_cursor}


def list_serializer(item: type[serializers.Serializer[Any]], name: str) -> type[serializers.Serializer[Any]]:
    """The documented shape of a list response of `item` (for the OpenAPI schema)."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "object": serializers.CharField(default="list"),
            "data": item(many=True),
            "next_cursor": serializers.CharField(allow_null=True),
        },
    )
