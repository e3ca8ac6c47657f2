"""Cursor pagination: `{object: "list", data, next_cursor}`, newest first. The cursor,
`<created, microseconds since 1970>.<id>`, is a position after the last row: stable under
inserts and O(limit) at any depth. Every string of that form is a position, so the schema's
pattern is the whole rule: anything else is 400 `cursor_invalid`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, TypeVar

from django.core.validators import RegexValidator
from django.db.models import Model, Q, QuerySet
from rest_framework import serializers
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

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


class CursorPagination(BasePagination):
    """DRF's pagination interface (GenericAPIView's `paginate_queryset` and
    `get_paginated_response`) over the keyset above. Not DRF's CursorPagination: that one
    positions on one field and skips ties by an offset, in a base64 query string it answers
    404 for; these cursors are (created, id) positions of the documented form. The view has
    validated the query (`view.params`) before it asks for a page."""

    page_size = DEFAULT_PAGE_SIZE
    max_page_size = MAX_PAGE_SIZE
    next_cursor: str | None = None

    def paginate_queryset(self, queryset: QuerySet[Any] | Sequence[Any], request: Request, view: APIView | None = None) -> list[Any]:
        assert isinstance(queryset, QuerySet)
        params: dict[str, Any] = view.params  # type: ignore[union-attr]
        limit = min(int(params.get("limit") or self.page_size), self.max_page_size)
        qs = queryset
        for bound in ("gte", "gt", "lte", "lt"):
            if params.get(f"created_{bound}") is not None:
                qs = qs.filter(**{f"created__{bound}": params[f"created_{bound}"]})
        if params.get("cursor"):
            qs = _after(qs, params["cursor"])
        rows = list(qs.order_by("-created", "-pk")[: limit + 1])
        page = rows[:limit]
        if len(rows) > limit and page:
            self.next_cursor = cursor_of(created=page[-1].created, pk=page[-1].pk)
        return page

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"object": "list", "data": data, "next_cursor": self.next_cursor})


def cursor_of(*, created: datetime, pk: int | str) -> str:
    """The cursor of a position (created, pk), as `next_cursor` states it."""
    return f"{(created - _EPOCH) // timedelta(microseconds=1)}.{pk}"


def cursor_position(cursor: str) -> tuple[datetime, str]:
    """(created, pk as sent) of a cursor; 400 `cursor_invalid` if it is not of the form."""
    match = _CURSOR_RE.fullmatch(cursor)
    if match is None:
        raise serializers.ValidationError({"cursor": [serializers.ErrorDetail("invalid cursor", code="cursor_invalid")]})
    return _EPOCH + timedelta(microseconds=int(match.group(1))), match.group(2)


def _after(qs: QuerySet[M], cursor: str) -> QuerySet[M]:
    """The rows after the cursor's position, in the list's order (newest first)."""
    match = _CURSOR_RE.fullmatch(cursor)
    if match is None:
        raise serializers.ValidationError({"cursor": [serializers.ErrorDetail("invalid cursor", code="cursor_invalid")]})
    micros, raw_pk = match.groups()
    created = _EPOCH + timedelta(microseconds=int(micros))
    pk: str | int = int(raw_pk) if _INT_PK_RE.fullmatch(raw_pk) else raw_pk
    pk_field = qs.model._meta.pk
    int_pk = pk_field is not None and pk_field.get_internal_type() in {"AutoField", "BigAutoField"}
    if isinstance(pk, int) == int_pk:
        return qs.filter(Q(created__lt=created) | Q(created=created, pk__lt=pk))
    # An id of the other kind (another list's cursor): integer ids sort before string ids.
    return qs.filter(created__lte=created) if int_pk else qs.filter(created__lt=created)


@cache
def list_serializer(item: type[serializers.Serializer[Any]], name: str) -> type[serializers.Serializer[Any]]:
    """The documented shape of a list response of `item` (for the OpenAPI schema): one
    class per item and name, whoever asks."""
    return type(
        name,
        (serializers.Serializer,),
        {"object": serializers.CharField(default="list"), "data": item(many=True), "next_cursor": serializers.CharField(allow_null=True)},
    )
