"""GET /v1/customer/statements and /v1/merchant/statements: JSON pages, CSV and PDF agree;
each face sees what it sees of the other party; a refund of last month's payment lands in
this month and leaves last month's statement as it was; bad input is a 400, never a 500."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.http import StreamingHttpResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader

from tests.api.conftest import Api, World, error_of
from tests.api.test_money_endpoints import fund, pay
from wallets.models import AuditEntry

URL = {"customer": "/v1/customer/statements", "merchant": "/v1/merchant/statements"}


def _walk(api: Api, key: str, face: str, params: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every JSON page of a statement: (the first page, all lines)."""
    first: dict[str, Any] | None = None
    lines: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = api.get(URL[face], key, {**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.content
        body = r.json()
        first = first or body
        assert (body["opening_balance"], body["closing_balance"]) == (first["opening_balance"], first["closing_balance"])
        lines += body["lines"]
        cursor = body["next_cursor"]
        if cursor is None:
            return first, lines


def test_json_pages_csv_and_pdf_tell_the_same_statement_to_each_face(api: Api, world: World) -> None:
    start = datetime.now(UTC) - timedelta(minutes=1)
    fund(world, world.customer.obj, 5000)
    paid = [pay(api, world, amount) for amount in (1000, 300, 700)]
    assert api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid[0]["id"], "amount": 400}).status_code == 201
    params = {"asset": "JPY", "from": start.isoformat(), "to": (datetime.now(UTC) + timedelta(seconds=1)).isoformat(), "limit": 2}

    head, lines = _walk(api, world.merchant.key, "merchant", params)
    assert head["object"] == "statement" and head["party"] == world.merchant.id and head["final"] is False
    assert [line["kind"] for line in lines] == ["payment", "payment", "payment", "refund"]
    assert [line["reference"] for line in lines[:3]] == [p["id"] for p in paid]
    assert {line["counterparty"] for line in lines} == {world.customer.id}
    assert {line["counterparty_name"] for line in lines} == {None}  # a merchant sees its customers' ids, not their names
    assert [line["amount"] - line["fee"] for line in lines[:3]] == [1000, 300, 700]  # the fee taken is in the net amount
    assert [-line["fee"] for line in lines[:3]] == [p["fee"] for p in paid]
    running = head["opening_balance"]
    for line in lines:
        running += line["amount"]
        assert line["balance"] == running
    assert running == head["closing_balance"]

    r = api.get(URL["merchant"], world.merchant.key, {**params, "format": "csv"})
    assert r.status_code == 200 and isinstance(r, StreamingHttpResponse) and r["Content-Type"].startswith("text/csv")
    assert r["Tally-Statement-Final"] == "false" and "attachment" in r["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert [row["kind"] for row in rows] == ["opening_balance", *[line["kind"] for line in lines], "provisional_balance"]
    assert [int(row["balance"]) for row in rows[1:-1]] == [line["balance"] for line in lines]
    assert int(rows[-1]["balance"]) == head["closing_balance"]

    r = api.get(URL["merchant"], world.merchant.key, {**params, "format": "pdf"})
    assert r.status_code == 200 and r["Content-Type"] == "application/pdf"
    text = PdfReader(io.BytesIO(r.content)).pages[0].extract_text()
    assert world.merchant.id in text and "page 1 of 1" in text and "PROVISIONAL" in text and paid[0]["id"] in text

    head, lines = _walk(api, world.customer.key, "customer", params)
    assert head["party"] == world.customer.id and head["party_type"] == "customer"
    payments = [line for line in lines if line["kind"] == "payment"]
    assert [line["amount"] for line in payments] == [-1000, -300, -700]
    assert {(line["counterparty"], line["counterparty_name"]) for line in payments} == {(world.merchant.id, world.merchant.obj.name)}
    assert {line["fee"] for line in lines} == {None}  # the operator's fee is not the customer's business

    other = api.get(URL["merchant"], world.merchant2.key, {k: v for k, v in params.items() if k != "limit"}).json()
    assert other["lines"] == [] and other["party"] == world.merchant2.id  # only one's own


def test_a_refund_of_last_months_payment_is_this_months_and_last_months_statement_stays(api: Api, world: World) -> None:
    now = datetime.now(UTC)
    this_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    with time_machine.travel(this_month - timedelta(days=2), tick=True):
        fund(world, world.customer.obj, 5000)
        paid = pay(api, world, 2000)
    month = f"{last_month:%Y-%m}"
    before = api.get(URL["merchant"], world.merchant.key, {"asset": "JPY", "month": month}).json()
    assert [line["reference"] for line in before["lines"]] == [paid["id"]]
    assert before["final"] is True and before["period"]["from"] == last_month.isoformat()
    assert api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid["id"], "amount": 2000}).status_code == 201
    after = api.get(URL["merchant"], world.merchant.key, {"asset": "JPY", "month": month}).json()
    assert {**after, "as_of": None} == {**before, "as_of": None}
    current = api.get(URL["merchant"], world.merchant.key, {"asset": "JPY", "month": f"{this_month:%Y-%m}"}).json()
    assert current["final"] is False and current["opening_balance"] == before["closing_balance"]
    refund = current["lines"][-1]
    assert refund["kind"] == "refund" and refund["counterparty"] == world.customer.id
    assert refund["amount"] == -(2000 - refund["fee"])  # the operator gave its fee back
    assert current["closing_balance"] == current["opening_balance"] + sum(line["amount"] for line in current["lines"])


@pytest.mark.parametrize(("params", "param"), [
    ({}, "asset"),
    ({"asset": "NOPE", "month": "2026-01"}, "asset"),
    ({"asset": "jpy", "month": "2026-01"}, "asset"),
    ({"asset": "JPY", "month": "2026-13"}, "month"),
    ({"asset": "JPY", "month": "26-01"}, "month"),
    ({"asset": "JPY", "month": "0000-01"}, "month"),
    ({"asset": "JPY", "from": "yesterday", "to": "2026-01-01T00:00:00Z"}, "from"),
    ({"asset": "JPY", "month": "2026-01", "format": "xlsx"}, "format"),
    ({"asset": "JPY", "month": "2026-01", "cursor": "nope"}, "cursor"),
    ({"asset": "JPY", "month": "2026-01", "limit": "0"}, "limit"),
    ({"asset": "JPY", "month": "2026-01", "at": "2026-01-01T00:00:00Z"}, "at"),
    ({"asset": "JPY", "from": "2026-01-01T00:00:00", "to": "2026-01-02T00:00:00Z"}, "from"),  # no offset: no instant
    ({"asset": "JPY", "from": "2026-01-01T00:00:00Z", "to": "2026-01-02"}, "to"),
])
@pytest.mark.parametrize("face", ["customer", "merchant"])
def test_bad_input_is_a_400_naming_the_parameter(api: Api, world: World, face: str, params: dict[str, str], param: str) -> None:
    r = api.get(URL[face], getattr(world, face).key, params)
    assert r.status_code == 400, r.content
    assert error_of(r)["param"] == param


def test_a_period_before_the_tenant_or_far_back_answers_zero_and_no_lines(api: Api, world: World) -> None:
    for params in ({"month": "0001-01"}, {"from": "0001-01-01T00:00:00+09:00", "to": "0001-06-01T00:00:00Z"},
                   {"from": "2024-01-01T00:00:00Z", "to": "2025-01-01T00:00:00Z"}):  # 366 days: the longest period
        body = api.get(URL["customer"], world.customer.key, {"asset": "JPY", **params}).json()
        assert (body["opening_balance"], body["closing_balance"], body["lines"], body["final"]) == (0, 0, [], True)


@pytest.fixture
def zoned(world: World, tenant: Any) -> Iterator[Callable[[str], None]]:
    """Set the tenant's time zone for the test's requests (the row rolls back; the tenant object
    the connection holds outside requests is put back)."""
    from django.db import connection

    from tenants.models import Tenant

    def set_zone(name: str) -> None:
        Tenant.objects.filter(pk=tenant.pk).update(time_zone=name)

    yield set_zone
    connection.set_tenant(tenant)


@pytest.mark.parametrize(("zone", "params", "period"), [
    # Neither month nor from: the current month so far; month decides over from/to.
    ("UTC", {}, None),
    ("UTC", {"month": "2026-01", "from": "2020-01-01T00:00:00Z"}, ("2026-01-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00")),
    # Ends before it starts: empty. Longer than 366 days: ends 366 days after its start.
    ("UTC", {"from": "2026-02-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, ("2026-02-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00")),
    ("UTC", {"from": "2025-01-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"}, ("2025-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00")),
    # In the future: empty, not final. At the calendar's edges in a zone: kept inside it.
    ("UTC", {"month": "3026-01"}, ("3026-01-01T00:00:00+00:00", "3026-02-01T00:00:00+00:00")),
    ("America/New_York", {"from": "0001-01-01T01:00:00Z", "to": "0001-02-01T00:00:00Z"}, None),
    ("Asia/Tokyo", {"from": "9999-01-01T00:00:00Z", "to": "9999-12-31T20:00:00Z"}, None),
    ("Asia/Tokyo", {"month": "0001-01"}, None),
    ("UTC", {"month": "9999-12"}, None),
])
@pytest.mark.parametrize("format", ["json", "csv", "pdf"])
def test_every_period_the_schema_allows_has_its_documented_answer(
    api: Api, world: World, zoned: Callable[[str], None], zone: str, params: dict[str, str], period: tuple[str, str] | None, format: str,
) -> None:
    zoned(zone)
    r = api.get(URL["merchant"], world.merchant.key, {"asset": "JPY", "format": format, **params})
    assert r.status_code == 200, r.content
    if format == "json" and period is not None:
        body = r.json()
        assert (body["period"]["from"], body["period"]["to"]) == period, body["period"]
        assert body["closing_balance"] == body["opening_balance"] + sum(line["amount"] for line in body["lines"])


def test_a_fully_refunded_payments_fees_net_to_zero_in_json_csv_and_pdf(api: Api, world: World) -> None:
    from tests.test_fees import schedule

    schedule(merchant=world.merchant.obj)  # 3% + 5
    start = datetime.now(UTC) - timedelta(minutes=1)
    fund(world, world.customer.obj, 5000)
    paid = pay(api, world, 2000)
    assert paid["fee"] == 65  # the proportional policy gives all of it back with the whole refund
    assert api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid["id"], "amount": 2000}).status_code == 201
    params = {"asset": "JPY", "from": start.isoformat(), "to": (datetime.now(UTC) + timedelta(seconds=1)).isoformat()}
    _, lines = _walk(api, world.merchant.key, "merchant", params)
    assert [(line["kind"], line["fee"]) for line in lines] == [("payment", -paid["fee"]), ("refund", paid["fee"])]
    assert sum(line["amount"] for line in lines) == 0  # the merchant is back where it was, fee and all
    rows = list(csv.reader(io.StringIO(b"".join(api.get(URL["merchant"], world.merchant.key, {**params, "format": "csv"})
                                                  .streaming_content).decode())))
    assert rows[-1][1] == "provisional_balance" and (rows[-1][5], rows[-1][6]) == ("0", "0")  # amounts, fees (was 2 x the fee)
    r = api.get(URL["merchant"], world.merchant.key, {**params, "format": "pdf"})
    text = PdfReader(io.BytesIO(r.content)).pages[0].extract_text()
    totals = text.split("provisional balance", 1)[1].split()  # the totals block, one cell a word (labels joined back)
    assert " ".join(totals).count("Fees taken -65 Fees given back 65 Fees (net) 0") == 1, totals


def test_a_pdf_of_too_many_lines_is_a_400_pointing_to_csv(api: Api, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.api.test_backoffice import _login, q

    start = datetime.now(UTC) - timedelta(minutes=1)
    fund(world, world.customer.obj, 5000)
    for amount in (100, 200, 300):
        pay(api, world, amount)
    monkeypatch.setattr("payments.statements.PDF_MAX_LINES", 2)  # the cap is 20,000: three lines stand for them
    params = {"asset": "JPY", "from": start.isoformat(), "to": (datetime.now(UTC) + timedelta(seconds=1)).isoformat()}
    r = api.get(URL["merchant"], world.merchant.key, {**params, "format": "pdf"})
    assert r.status_code == 400 and error_of(r)["param"] == "format" and "use format=csv" in error_of(r)["message"], r.content
    assert api.get(URL["merchant"], world.merchant.key, {**params, "format": "csv"}).status_code == 200
    client = _login("stmt-pdf-viewer", role="viewer")
    r = client.get(f"/admin/wallets/merchant/{q(world.merchant.id)}/statement/",
                   {"asset": "JPY", "start": params["from"], "end": params["to"], "format": "pdf", "download": "1"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/html") and b"too many lines for a PDF" in r.content
    assert not AuditEntry.objects.filter(action="statement.download", target_id=world.merchant.id).exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(
    st.sampled_from(["asset", "month", "from", "to", "format", "cursor", "limit"]),
    st.one_of(st.text(max_size=30), st.sampled_from(["JPY", "2026-10", "2026-10-01T00:00:00+02:00", "csv", "pdf", "1.1", "1"])),
))
def test_no_parameters_make_a_500(api: Api, world: World, params: dict[str, str]) -> None:
    r = api.get(URL["merchant"], world.merchant.key, params)
    assert r.status_code in (200, 400), r.content


def test_staff_download_any_partys_statement_from_the_back_office_and_it_is_audited(api: Api, world: World) -> None:
    from tests.api.test_backoffice import _login, q

    fund(world, world.customer.obj, 5000)
    paid = pay(api, world, 1200)
    client = _login("stmt-viewer", role="viewer")  # every role sees the ledger, so every role may download
    page = client.get(f"/admin/wallets/merchant/{q(world.merchant.id)}/change/")
    statement_url = f"/admin/wallets/merchant/{q(world.merchant.id)}/statement/"
    assert statement_url in page.content.decode()
    assert client.get(statement_url).status_code == 200  # the form
    month = f"{datetime.now(UTC):%Y-%m}"
    r = client.get(statement_url, {"asset": "JPY", "month": month, "format": "csv", "download": "1"})
    assert r.status_code == 200 and isinstance(r, StreamingHttpResponse)
    rows = list(csv.DictReader(io.StringIO(b"".join(r.streaming_content).decode())))
    line = next(row for row in rows if row["reference"] == paid["id"])
    # Staff see the customer's name and the fee, which no face shows together.
    assert (line["counterparty"], line["counterparty_name"], int(line["fee"])) == (world.customer.id, world.customer.obj.name, -paid["fee"])
    audit = AuditEntry.objects.filter(action="statement.download", target_id=world.merchant.id).get()
    assert audit.actor == "user:stmt-viewer" and audit.after["asset"] == "JPY"

    r = client.get(f"/admin/wallets/customer/{q(world.customer.id)}/statement/",
                   {"asset": "JPY", "start": "2026-01-01T00:00:00", "end": "2026-01-02T00:00:00Z", "format": "csv", "download": "1"})
    assert r.status_code == 200 and b"must carry a UTC offset" in r.content and not isinstance(r, StreamingHttpResponse)  # the form again
    r = client.get(f"/admin/wallets/customer/{q(world.customer.id)}/statement/", {"asset": "JPY", "month": month, "format": "pdf", "download": "1"})
    assert r.status_code == 200 and r["Content-Type"] == "application/pdf"
    assert paid["id"] in PdfReader(io.BytesIO(r.content)).pages[0].extract_text()
