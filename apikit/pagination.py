"""Cursor pagination: `{object: "list", data, next_cursor}`, newest first.

The cursor is an opaque token over the last row's (created, id): stable under inserts
(new rows land before the first page, never inside a later one) and O(limit) per page
at any depth, unlike offsets.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.core.validators import RegexValidator
from django.db.models import Model, Q, QuerySet
from rest_framework import serializers

from apikit.shapes import Serializer

# base64url without padding: the alphabet of every cursor `_encode` issues.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100

M = TypeVar("M", bound=Model)


def _encode(created: datetime, pk: str | int) -> str:
    raw = json.dumps([created.isoformat(), pk], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str | int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_iso, pk = json.loads(raw)
        created = datetime.fromisoformat(created_iso)
        valid_pk = (isinstance(pk, str) and "\x00" not in pk and len(pk) <= 64) or (
            isinstance(pk, int) and not isinstance(pk, bool) and 0 < pk < 2**63
        )
        if not valid_pk or created.tzinfo is None:
            raise ValueError(pk)
        return created, pk
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise serializers.ValidationError({"cursor": [serializers.ErrorDetail("invalid cursor", code="cursor_invalid")]}) from None


class ListParamsSerializer(Serializer):
    """Query parameters shared by every list endpoint."""

    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=10**6, help_text=f"Page size, default {DEFAULT_PAGE_SIZE}, capped at {MAX_PAGE_SIZE}."
    )
    cursor = serializers.CharField(
        required=False,
        max_length=512,
        validators=[RegexValidator(CURSOR_PATTERN, message="invalid cursor", code="cursor_invalid")],
        help_text=(
            "Opaque: the `next_cursor` of the previous page, passed back unchanged. "
            "A cursor that was not issued by this list is refused (400 `cursor_invalid`)."
        ),
    )
    created_gte = serializers.DateTimeField(required=False, help_text="Only objects created at or after this time (ISO 8601).")
    created_lt = serializers.DateTimeField(required=False, help_text="Only objects created before this time (ISO 8601).")


def page(
    queryset: QuerySet[M],
    params: dict[str, Any],
    render: Callable[[Sequence[M]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """One page of `queryset` (any model with `created` and a string pk), rendered."""
    limit = min(int(params.get("limit") or DEFAULT_PAGE_SIZE), MAX_PAGE_SIZE)
    qs = queryset
    if params.get("created_gte") is not None:
        qs = qs.filter(created__gte=params["created_gte"])
    if params.get("created_lt") is not None:
        qs = qs.filter(created__lt=params["created_lt"])
    if params.get("cursor"):
        created, pk = decode_cursor(params["cursor"])
        pk_field = queryset.model._meta.pk
        int_pk = pk_field is not None and pk_field.get_internal_type() in {"AutoField", "BigAutoField"}
        if isinstance(pk, int) != int_pk:  # a cursor from another list
            raise serializers.ValidationError({"cursor": [serializers.ErrorDetail("invalid cursor", code="cursor_invalid")]})
        qs = qs.filter(Q(created__lt=created) | Q(created=created, pk__lt=pk))
    rows = list(qs.order_by("-created", "-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = _encode(rows[-1].created, rows[-1].pk) if more and rows else None  # type: ignore[attr-defined]
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
