"""A statement as a file: CSV (streamed, row by row) and PDF (reportlab). Used by the
faces and the back office alike; the content comes from payments.statements.

CSV layout, one header row then:
- `opening_balance` row: the period's start (local time) and the opening balance;
- one row per ledger line: time (ISO 8601 in the tenant's zone, with its offset), kind,
  reference (the object's id), counterparty id and name (where the viewer may see them), amount (signed,
  minor units), fee (signed as it moved the balance: taken negative, given back positive; where shown),
  running balance;
- `closing_balance` row (`provisional_balance` while the statement is not final): the
  period's end, the sum of the lines' amounts and of their signed fees, the closing balance.
Amounts are integers in the asset's minor unit, as everywhere in the API.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from reportlab.lib.pagesizes import A4, landscape
from reportlab.lib.units import mm
from reportlab.pdfgen import canvas

from payments.statements import StatementHead, StatementLine

CSV_COLUMNS = ["time", "kind", "reference", "counterparty", "counterparty_name", "amount", "fee", "balance"]


def statement_filename(head: StatementHead, extension: str) -> str:
    start = head.start.astimezone(head.zone).strftime("%Y%m%dT%H%M")
    end = head.end.astimezone(head.zone).strftime("%Y%m%dT%H%M")
    return f"statement_{head.party_id}_{head.asset.code}_{start}_{end}.{extension}"


def _local(head: StatementHead, instant: datetime) -> str:
    return instant.astimezone(head.zone).isoformat()


CSV_PIECE = 32 * 1024  # characters per streamed piece: few enough pieces to be cheap, small enough to stay flat


def statement_csv_rows(head: StatementHead, lines: Iterable[StatementLine]) -> Iterator[str]:
    """The CSV text in pieces of about CSV_PIECE characters: a generator, so a streamed
    response holds one piece at a time whatever the period holds."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def piece() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(CSV_COLUMNS)
    writer.writerow([_local(head, head.start), "opening_balance", "", "", "", "", "", head.opening])
    total = fees = 0
    balance = head.opening
    for line in lines:
        total += line.amount
        fees += line.fee or 0
        balance = line.balance
        writer.writerow([line.time.isoformat(), line.kind, line.object_id, line.counterparty or "", _csv_text(line.counterparty_name),
                         line.amount, "" if line.fee is None else line.fee, line.balance])
        if buffer.tell() >= CSV_PIECE:
            yield piece()
    # The closing is the lines' own running balance: the file adds up whatever was committed
    # while it streamed; once final, it is the balance before the end.
    writer.writerow([_local(head, head.end), "closing_balance" if head.final else "provisional_balance", "", "", "", total, fees, balance])
    yield piece()


def _csv_text(value: str | None) -> str:
    """A name as a cell a spreadsheet shows and never runs (no leading =, +, -, @)."""
    if not value:
        return ""
    return "'" + value if value[0] in "=+-@\t\r" else value


def _amount(value: int, exponent: int) -> str:
    return f"{Decimal(value).scaleb(-exponent):,.{exponent}f}"


class _NumberedCanvas(canvas.Canvas):  # type: ignore[misc]  # reportlab ships no types
    """Keeps each page until the end, so every page can say "page N of M"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pages: list[dict[str, Any]] = []

    def showPage(self) -> None:  # reportlab's name
        self._pages.append(dict(self.__dict__))
        self._startPage()

    def save(self) -> None:
        total = len(self._pages)
        for number, state in enumerate(self._pages, start=1):
            self.__dict__.update(state)
            self.setFont("Helvetica", 8)
            self.drawRightString(self._pagesize[0] - 15 * mm, 10 * mm, f"page {number} of {total}")
            super().showPage()
        super().save()


PDF_ROWS_PER_PAGE = 42
# A place on the PDF page in typographic points, as reportlab takes it (a float by its API).
# Only text positions are these; amounts stay int minor units and are formatted as text.
PagePoints = float
_COLUMNS_X = [15, 58, 85, 130, 165, 215, 240, 265]  # mm: time, kind, object, counterparty, name, amount, fee, balance (right-aligned from amount)


def statement_pdf(head: StatementHead, lines: Iterable[StatementLine]) -> bytes:
    """The statement as a PDF: the tenant's name, the party, the period, its lines with
    running balances, the totals, "page N of M" on every page."""
    out = io.BytesIO()
    pdf = _NumberedCanvas(out, pagesize=landscape(A4), pageCompression=1)
    pdf.setTitle(f"Statement {head.party_id} {head.asset.code}")
    height = landscape(A4)[1]
    exponent = head.asset.exponent
    zone = str(head.zone)
    period = f"{_local(head, head.start)} to {_local(head, head.end)} ({zone}, end excluded)"
    status = "final" if head.final else f"PROVISIONAL (as of {_local(head, head.as_of)}; may still change)"

    def page_top() -> PagePoints:
        pdf.setFont("Helvetica-Bold", 13)
        pdf.drawString(15 * mm, height - 15 * mm, f"{head.tenant_name}: statement of account")
        pdf.setFont("Helvetica", 9)
        pdf.drawString(15 * mm, height - 21 * mm, f"{head.party_type.capitalize()}: {head.party_name} ({head.party_id})   Asset: {head.asset.code}")
        pdf.drawString(15 * mm, height - 26 * mm, f"Period: {period}   Status: {status}")
        y = height - 34 * mm
        pdf.setFont("Helvetica-Bold", 8)
        for x, title in zip(_COLUMNS_X, ["Time", "Kind", "Object", "Counterparty", "Name"], strict=False):
            pdf.drawString(x * mm, y, title)
        for x, title in zip(_COLUMNS_X[5:], ["Amount", "Fee", "Balance"], strict=True):
            pdf.drawRightString((x + 20) * mm, y, title)
        pdf.setFont("Helvetica", 8)
        return PagePoints(y - 5 * mm)

    def cells(y: PagePoints, left: list[str], right: list[str]) -> None:
        for x, text in zip(_COLUMNS_X, left, strict=False):
            pdf.drawString(x * mm, y, text)
        for x, text in zip(_COLUMNS_X[5:], right, strict=True):
            pdf.drawRightString((x + 20) * mm, y, text)

    y = page_top()
    rows = 0

    def next_row() -> PagePoints:
        nonlocal y, rows
        if rows == PDF_ROWS_PER_PAGE:
            pdf.showPage()
            y, rows = page_top(), 0
        rows += 1
        current = y
        y -= 4 * mm
        return current

    cells(next_row(), [_local(head, head.start)[:19], "opening balance"], ["", "", _amount(head.opening, exponent)])
    credits = debits = fees_taken = fees_back = count = 0
    balance = head.opening
    for line in lines:
        count += 1
        credits += max(line.amount, 0)
        debits += min(line.amount, 0)
        fees_taken += min(line.fee or 0, 0)
        fees_back += max(line.fee or 0, 0)
        balance = line.balance
        cells(next_row(), [line.time.isoformat()[:19], line.kind, line.object_id, line.counterparty or "", (line.counterparty_name or "")[:28]],
              [_amount(line.amount, exponent), "" if line.fee is None else _amount(line.fee, exponent), _amount(line.balance, exponent)])
    closing = "closing balance" if head.final else "provisional balance"
    cells(next_row(), [_local(head, head.end)[:19], closing], ["", "", _amount(balance, exponent)])
    # Fees are signed as they moved the balance (taken negative, given back positive), so the
    # net is the CSV closing row's fee and a fully refunded payment's fees net to zero.
    totals = [("Opening balance", head.opening), ("Credits", credits), ("Debits", debits)]
    if head.party_type == "merchant":
        totals += [("Fees taken", fees_taken), ("Fees given back", fees_back), ("Fees (net)", fees_taken + fees_back)]
    for label, value in (*totals, (closing.capitalize(), balance)):
        cells(next_row(), ["", label], [_amount(value, exponent), "", ""])
    cells(next_row(), ["", f"{count} lines"], ["", "", ""])
    pdf.showPage()
    pdf.save()
    return out.getvalue()
