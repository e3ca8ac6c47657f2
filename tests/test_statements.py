"""Statements (payments/statements.py, payments/statement_files.py): they add up, months
chain, lines land in the tenant's months across DST and month edges, CSV streams in flat
memory, the PDF reads back, finality."""

from __future__ import annotations

import csv
import io
import itertools
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader

from payments.statement_files import statement_csv_rows, statement_pdf
from payments.statements import StatementHead, Viewer, statement_account_get, statement_head, statement_lines
from tenants.models import Tenant
from wallets.books import account_balance_before, month_bounds
from wallets.models import Account, Asset, LedgerEntry, LedgerTransaction, Merchant, SystemRole
from wallets.services.ledger import Leg, ledger_post
from wallets.services.principals import merchant_create

_refs = itertools.count()


@pytest.fixture
def zoned(tenant: Tenant) -> Iterator[Tenant]:
    """The tenant, whose time zone a test may set; put back to UTC after."""
    yield tenant
    tenant.time_zone = "UTC"


def _post(account: Account, amount: int, at: datetime, *, asset: str = "JPY") -> None:
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    ledger_post(kind="adjustment", reference=f"adj_t{next(_refs)}", legs=[Leg(account, asset, amount), Leg(source, asset, -amount)],
                created=at)


def _merchant() -> tuple[Merchant, Account]:
    merchant = merchant_create(name=f"Statements {next(_refs)}")
    return merchant, Account.objects.get(merchant=merchant)


def _head(merchant: Merchant, start: datetime, end: datetime, *, now: datetime | None = None) -> StatementHead:
    account, party_type, name = statement_account_get(merchant_id=merchant.pk)
    return statement_head(account=account, party_type=party_type, party_name=name, asset=Asset.objects.get(code="JPY"),
                          start=start, end=end, now=now)


def _check_adds_up(head: StatementHead) -> list[int]:
    lines = list(statement_lines(head=head, viewer=Viewer.STAFF))
    running = head.opening
    for line in lines:
        running += line.amount
        assert line.balance == running
    assert head.closing == running == account_balance_before(account_id=head.account_id, asset_code="JPY", instant=head.end)
    return [line.amount for line in lines]


ZONES = ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(zone=st.sampled_from(ZONES), moves=st.lists(st.tuples(st.integers(0, 3 * 31 * 24 * 60 - 1), st.integers(-900, 1000)), max_size=25))
def test_opening_plus_lines_is_closing_and_each_month_opens_at_the_last_ones_close(
    zoned: Tenant, zone: str, moves: list[tuple[int, int]],
) -> None:
    zoned.time_zone = zone
    merchant, account = _merchant()
    tz = ZoneInfo(zone)
    first, _ = month_bounds(month=date(2026, 9, 1), zone=tz)
    _post(account, 10**6, first - timedelta(days=3))  # funds, so every debit below is covered
    for minutes, amount in moves:
        if amount:
            _post(account, amount, first + timedelta(minutes=minutes))
    months = [date(2026, 9, 1), date(2026, 10, 1), date(2026, 11, 1), date(2026, 12, 1)]
    heads = [_head(merchant, *month_bounds(month=m, zone=tz)) for m in months]
    seen = []
    for before, after in itertools.pairwise(heads):
        assert before.closing == after.opening
    for head in heads:
        seen += _check_adds_up(head)
    assert sorted(seen) == sorted(amount for minutes, amount in moves if amount and first + timedelta(minutes=minutes) < heads[-1].end)


@pytest.mark.parametrize(("zone", "month_end_local"), [
    ("Europe/Berlin", datetime(2026, 11, 1)),  # October's last Sunday (25th) ended summer time inside the month
    ("Europe/Berlin", datetime(2026, 4, 1)),  # March's last Sunday began it
    ("America/New_York", datetime(2026, 11, 1)),  # its summer time ends at 02:00 on November 1st, after this midnight
    ("America/New_York", datetime(2026, 12, 1)),
    ("Asia/Tokyo", datetime(2026, 12, 1)),
])
def test_a_line_just_before_local_midnight_is_in_the_month_and_one_at_it_in_the_next(
    zoned: Tenant, zone: str, month_end_local: datetime,
) -> None:
    zoned.time_zone = zone
    tz = ZoneInfo(zone)
    merchant, account = _merchant()
    midnight = month_end_local.replace(tzinfo=tz).astimezone(UTC)
    _post(account, 7, midnight - timedelta(microseconds=1))
    _post(account, 11, midnight)
    last_day = (month_end_local - timedelta(days=1)).date()
    month = _head(merchant, *month_bounds(month=last_day, zone=tz))
    following = _head(merchant, *month_bounds(month=month_end_local.date(), zone=tz))
    assert month.end == following.start == midnight
    assert _check_adds_up(month) == [7] and _check_adds_up(following) == [11]
    line = next(statement_lines(head=month, viewer=Viewer.MERCHANT))
    assert line.time.utcoffset() == tz.utcoffset(month_end_local - timedelta(hours=1))  # shown in the tenant's zone
    assert (line.time.date(), line.time.hour, line.time.minute) == (last_day, 23, 59)


def test_an_empty_month_opens_and_closes_at_the_same_balance(tenant: Tenant) -> None:
    merchant, account = _merchant()
    _post(account, 500, datetime(2026, 1, 10, tzinfo=UTC))
    head = _head(merchant, *month_bounds(month=date(2026, 2, 1), zone=ZoneInfo("UTC")))
    assert head.opening == head.closing == 500
    assert list(statement_lines(head=head, viewer=Viewer.MERCHANT)) == []


def test_a_statement_is_provisional_until_postings_in_flight_are_over(tenant: Tenant, settings: object) -> None:
    merchant, _ = _merchant()
    end = datetime(2026, 10, 1, tzinfo=UTC)
    bound = timedelta(seconds=float(settings.TALLY_STATEMENT_FINAL_AFTER_SECONDS))  # type: ignore[attr-defined]
    assert bound >= timedelta(seconds=180)  # outlasts a Celery task's hard limit and a request's
    just_after = _head(merchant, end - timedelta(days=30), end, now=end + bound - timedelta(seconds=1))
    later = _head(merchant, end - timedelta(days=30), end, now=end + bound)
    assert (just_after.final, later.final) == (False, True)
    rows = list(csv.reader(io.StringIO("".join(statement_csv_rows(just_after, [])))))
    assert rows[-1][1] == "provisional_balance"
    assert "PROVISIONAL" in PdfReader(io.BytesIO(statement_pdf(just_after, []))).pages[0].extract_text()
    assert list(csv.reader(io.StringIO("".join(statement_csv_rows(later, [])))))[-1][1] == "closing_balance"
    last = datetime.max.replace(tzinfo=UTC)  # the latest instant: `end + bound` would overflow
    assert _head(merchant, last - timedelta(days=1), last).final is False


def _bulk(account: Account, count: int, start: datetime) -> None:
    """`count` credits of 1 on the account, one a second from `start`, inserted directly (the
    statement reads entries; balances are not its business)."""
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    for offset in range(0, count, 5000):
        txns, entries = [], []
        for i in range(offset, min(count, offset + 5000)):
            at = start + timedelta(seconds=i)
            txn = LedgerTransaction(kind="adjustment", reference=f"adj_bulk{i}", created=at)
            txns.append(txn)
            entries += [LedgerEntry(transaction=txn, account=account, asset_id="JPY", amount=1, created=at),
                        LedgerEntry(transaction=txn, account=source, asset_id="JPY", amount=-1, created=at)]
        LedgerTransaction.objects.bulk_create(txns)
        LedgerEntry.objects.bulk_create(entries)


def _csv_peak(merchant: Merchant, start: datetime, end: datetime) -> tuple[int, int]:
    head = _head(merchant, start, end)
    tracemalloc.start()
    try:
        rows = 0
        for piece in statement_csv_rows(head, statement_lines(head=head, viewer=Viewer.MERCHANT)):
            rows += piece.count("\n")
        return rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_csv_streams_in_flat_memory_whatever_the_period_holds(tenant: Tenant) -> None:
    start = datetime(2025, 3, 1, tzinfo=UTC)
    small, small_account = _merchant()
    large, large_account = _merchant()
    _bulk(small_account, 1000, start)
    _bulk(large_account, 30_000, start)
    end = start + timedelta(days=1)
    small_rows, small_peak = _csv_peak(small, start, end)
    large_rows, large_peak = _csv_peak(large, start, end)
    assert (small_rows, large_rows) == (1003, 30_003)
    # 30 times the lines, about the same peak: one chunk of rows at a time, never the file.
    assert large_peak < small_peak * 2 + 512 * 1024, (small_peak, large_peak)


def test_the_pdf_names_the_tenant_the_party_the_period_totals_and_pages(tenant: Tenant) -> None:
    merchant, account = _merchant()
    start = datetime(2025, 5, 1, tzinfo=UTC)
    _post(account, 1000, start - timedelta(days=1))
    _bulk(account, 100, start)
    _post(account, -250, start + timedelta(hours=2))
    head = _head(merchant, start, start + timedelta(days=1))
    reader = PdfReader(io.BytesIO(statement_pdf(head, statement_lines(head=head, viewer=Viewer.MERCHANT))))
    pages = [page.extract_text() for page in reader.pages]
    assert len(pages) == 3
    assert all(f"page {n} of 3" in text for n, text in enumerate(pages, start=1))
    first, last = pages[0], pages[-1]
    assert tenant.name in first and merchant.name in first and merchant.pk in first
    assert "2025-05-01T00:00:00+00:00 to 2025-05-02T00:00:00+00:00" in first and "Status: final" in first
    assert "Opening balance" in last and "1,000" in last and "Credits" in last and "100" in last and "-250" in last
    assert "Closing balance" in last and "850" in last and "101 lines" in last
