"""Statements on the customer and merchant faces: the shapes and the one view both faces'
`GET .../statements` run (payments/statements.py reads, payments/statement_files.py renders).

The period: `month=YYYY-MM` (the tenant's calendar month, in its time zone), else `from`
and `to` (ISO 8601 instants with offsets, end excluded). Every period the schema allows has
an answer, since no rule the schema cannot state may be a 400 (docs/SCHEMA_CHECK.md): see
`StatementParams.validate`. Refused (400) are what the schema states (an instant without an
offset, a malformed month) and a PDF of more than PDF_MAX_LINES lines (the CSV streams any
size). One that has not ended yet answers what the ledger holds so far, with `final: false`
(CSV and PDF say "provisional"). A period before the tenant's first entry answers zero
balances and no lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from apikit.base import FaceViewSet, StrictSerializer
from apikit.fields import AssetFilterField, ConstField, InstantFilterField
from apikit.pagination import CURSOR_MAX_LENGTH, CURSOR_PATTERN, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, cursor_of, cursor_position
from apikit.schema import ErrorSerializer
from apikit.shapes import Serializer
from payments import statements
from payments.statement_files import statement_csv_rows, statement_filename, statement_pdf
from payments.statements import MAX_PERIOD, StatementHead, Viewer, statement_head, statement_line_count_exceeds, statement_lines
from tenants.selectors import tenant_zone
from wallets.books import month_bounds
from wallets.models import Account, Asset

S = serializers
F = TypeVar("F", bound=Callable[..., Any])
FORMATS = ("json", "csv", "pdf")
_MONTH_RE = r"^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])$"
# Instants a tenant's zone can always show: year 1 or 9999 shifted by an offset leaves the calendar.
_EARLIEST, _LATEST = datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)
_ENTRY_ID_RE = re.compile(r"[0-9]{1,18}")
_AFTER_EVERY_ENTRY = 2**63 - 1  # the largest bigint id


def _period_error(param: str, message: str) -> S.ValidationError:
    return S.ValidationError({param: [S.ErrorDetail(message, code="invalid")]})


class StatementInstantField(InstantFilterField):
    """`from` or `to`: an instant, so it must carry its offset (a wall clock alone names none)."""

    default_error_messages = {
        "naive": "must carry a UTC offset or Z (e.g. 2026-11-01T00:00:00+09:00): a date and time alone name no instant",
    }

    def enforce_timezone(self, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            self.fail("naive")
        return super().enforce_timezone(value)


PERIOD_DAYS = MAX_PERIOD.days


def pdf_too_long_message() -> str:
    return f"too many lines for a PDF (more than {statements.PDF_MAX_LINES:,}): use format=csv"


class StatementParams(StrictSerializer):
    asset = AssetFilterField(help_text="Asset code (required), e.g. JPY: a code this tenant lacks is 400 `asset_unknown`.")
    month = S.RegexField(
        _MONTH_RE, required=False, max_length=7,
        help_text="A calendar month, YYYY-MM, in the tenant's time zone (local midnight of its first day to that of the next month's);"
        " when given, it decides the period and `from`/`to` are ignored. With neither: the current month so far.",
    )
    locals()["from"] = StatementInstantField(  # `from` is a Python keyword
        required=False, help_text="Start of the period (ISO 8601 with its offset or Z; without one: 400), included; ignored with `month`. Default:"
        f" the start of the month (tenant's zone) of `to`. A period is at most {PERIOD_DAYS} days: a longer one ends {PERIOD_DAYS} days"
        " after its start (the answer's `period.to` says where).",
    )
    to = StatementInstantField(
        required=False, help_text="End of the period (ISO 8601 with its offset or Z; without one: 400), excluded; ignored with `month`. Default:"
        " now. Before `from`: an empty period (opening = closing, no lines). In the future: what the ledger holds so far, not final.",
    )
    format = S.ChoiceField(
        FORMATS, required=False, default="json",
        help_text=f"json (paginated), csv (streamed, any size) or pdf (at most {statements.PDF_MAX_LINES:,} lines; more: 400, use csv).",
    )
    limit = S.IntegerField(
        required=False, min_value=1, max_value=10**6, help_text=f"JSON page size, default {DEFAULT_PAGE_SIZE}, capped at {MAX_PAGE_SIZE}."
    )
    cursor = S.RegexField(
        CURSOR_PATTERN, required=False, max_length=CURSOR_MAX_LENGTH, error_messages={"invalid": "invalid cursor"},
        help_text="Opaque: the `next_cursor` of the previous JSON page, sent with the same period. Lines go oldest first.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Every schema-valid period has an answer (no rule here that the schema cannot state
        is a 400): `month` decides when given; else `from` (default: the start of the month
        of `to`, or of now) to `to` (default: now). A period ending before it starts is
        empty; one longer than PERIOD_DAYS ends PERIOD_DAYS after its start; instants are
        kept inside the years the tenant's zone can show; a period in the future is empty
        and not final."""
        zone = tenant_zone()
        if "month" in attrs:
            year, month = (int(part) for part in attrs["month"].split("-"))
            try:
                start, end = month_bounds(month=date(year, month, 1), zone=zone)
            except (ValueError, OverflowError):  # January of year 1 east of UTC, December 9999: the calendar's edge
                start, end = (_EARLIEST, _EARLIEST + timedelta(days=30)) if year == 1 else (_LATEST - timedelta(days=30), _LATEST)
        else:
            end = attrs.get("to") or timezone.now()
            start = attrs.get("from") or month_bounds(month=min(max(end, _EARLIEST), _LATEST).astimezone(zone).date(), zone=zone)[0]
        start = min(max(start, _EARLIEST), _LATEST)
        end = min(max(end, start), _LATEST)
        if end - start > MAX_PERIOD:  # never start + MAX_PERIOD first: near year 9999 it leaves the calendar
            end = start + MAX_PERIOD
        return {**attrs, "start": start, "end": end}


class LocalInstantField(S.DateTimeField):
    """An instant as given, with its own offset (the tenant's zone): DRF's would convert it to the server's."""

    def to_representation(self, value: datetime) -> str:
        return value.isoformat()


class StatementLineOut(Serializer):
    time = LocalInstantField(help_text="When the ledger line was made, in the tenant's time zone (ISO 8601 with its offset).")
    kind = S.CharField(help_text="The ledger transaction's kind: payment, refund, transfer, topup, adjustment, payout, payout_paid, payout_back.")
    reference = S.CharField(source="object_id", help_text="The business object's id (pay_..., ref_..., trf_..., top_..., adj_..., po_...).")
    counterparty = S.CharField(
        allow_null=True, help_text="The other party's id where this face shows it: the merchant of a customer's payment or refund, "
        "the customer of a merchant's, the other customer of a transfer; null for top-ups, adjustments and payouts.",
    )
    counterparty_name = S.CharField(allow_null=True, help_text="The merchant's name on a customer's statement; else null.")
    amount = S.IntegerField(help_text="Signed, minor units: positive credits the account. A merchant's payment line is its net.")
    fee = S.IntegerField(
        allow_null=True, help_text="Merchant statements: the operator's fee, signed as it moved the balance and already in `amount`: "
        "a payment's fee taken is negative (amount = the payment + fee), a refund's fee given back positive (amount = -the refund + "
        "fee). A fully refunded payment's fees sum to zero. Null elsewhere.",
    )
    balance = S.IntegerField(help_text="The running balance after this line.")


class StatementPeriodOut(Serializer):
    month = S.CharField(allow_null=True)
    locals()["from"] = LocalInstantField(help_text="Start, included (the tenant's time zone).")  # `from` is a Python keyword
    to = LocalInstantField(help_text="End, excluded (the tenant's time zone).")
    time_zone = S.CharField()


class StatementOut(Serializer):
    object = ConstField("statement")
    party_type = S.CharField(help_text="customer or merchant")
    party = S.CharField(source="party_id")
    asset = S.CharField(source="asset.code")
    period = StatementPeriodOut(source="*")
    opening_balance = S.IntegerField(source="opening", help_text="The balance before the period's start.")
    closing_balance = S.IntegerField(source="closing", help_text="The balance before the period's end: opening + every line's amount.")
    final = S.BooleanField(
        help_text="false while the period has not ended or ended less than a few minutes ago (a posting in flight may still add a "
        "line); once true, this statement never changes: corrections appear in the period they were made in.",
    )
    as_of = LocalInstantField(help_text="When this answer was read (the tenant's time zone).")
    lines = StatementLineOut(many=True)
    next_cursor = S.CharField(allow_null=True)


def statement_schema(tag: str) -> Callable[[F], F]:
    return extend_schema(
        tags=[tag], summary="Statement of one asset over a month or a range: opening, every line with its running balance, closing",
        parameters=[StatementParams],
        responses={
            (200, "application/json"): StatementOut,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="format=csv: streamed; layout in README.md, Statements."),
            (200, "application/pdf"): OpenApiResponse(OpenApiTypes.BINARY, description="format=pdf"),
            400: OpenApiResponse(
                ErrorSerializer, description="A malformed month or instant, an instant without an offset, a format not offered (or a PDF"
                f" of more than {statements.PDF_MAX_LINES:,} lines: use csv), a malformed cursor or an unknown asset (`asset_unknown`).",
            ),
        },
    )


class StatementMixin(FaceViewSet):
    viewer: ClassVar[Viewer]

    def statement_account(self) -> tuple[Account, str, str]:
        """(account, party type, party name) of the principal's statements."""
        raise NotImplementedError

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        # `format` is this endpoint's own parameter (json, csv, pdf), not DRF's renderer
        # override, which would answer 404 for csv; errors and JSON pages render as JSON.
        return JSONRenderer(), "application/json"

    def statement(self) -> HttpResponseBase:
        params = self.query(StatementParams)
        account, party_type, party_name = self.statement_account()
        head = statement_head(
            account=account, party_type=party_type, party_name=party_name, asset=Asset.objects.get(code=params["asset"]),
            start=params["start"], end=params["end"],
        )
        if params["format"] == "csv":
            rows = statement_csv_rows(head, statement_lines(head=head, viewer=self.viewer))
            response: HttpResponseBase = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="{statement_filename(head, "csv")}"'
        elif params["format"] == "pdf":
            if statement_line_count_exceeds(head=head, limit=statements.PDF_MAX_LINES):
                raise _period_error("format", pdf_too_long_message())
            response = HttpResponse(statement_pdf(head, statement_lines(head=head, viewer=self.viewer)), content_type="application/pdf")
            response["Content-Disposition"] = f'attachment; filename="{statement_filename(head, "pdf")}"'
        else:
            return self.render(StatementOut, self._page(head, params))
        response["Tally-Statement-Final"] = "true" if head.final else "false"
        return response

    def _page(self, head: StatementHead, params: dict[str, Any]) -> dict[str, Any]:
        limit = min(int(params.get("limit") or DEFAULT_PAGE_SIZE), MAX_PAGE_SIZE)
        after: tuple[datetime, int] | None = None
        if params.get("cursor"):
            created, entry_id = cursor_position(params["cursor"])
            # An id that is no entry's (another list's cursor, as apikit's lists read it): after its instant.
            after = (created, int(entry_id) if _ENTRY_ID_RE.fullmatch(entry_id) else _AFTER_EVERY_ENTRY)
        lines = list(statement_lines(head=head, viewer=self.viewer, after=after, limit=limit + 1))
        more = len(lines) > limit
        lines = lines[:limit]
        next_cursor = cursor_of(created=lines[-1].created, pk=lines[-1].entry_id) if more else None
        return {**vars(head), "party_id": head.party_id, "month": params.get("month"), "from": head.start.astimezone(head.zone),
                "to": head.end.astimezone(head.zone), "time_zone": str(head.zone), "as_of": head.as_of.astimezone(head.zone),
                "lines": lines, "next_cursor": next_cursor}
