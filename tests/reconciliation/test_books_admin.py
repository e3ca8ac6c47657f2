"""The books in the back office: the trial balance at an instant (page for the finance role,
streamed CSV, sums zero per asset, a non-zero sum shown loudly) and the month-end report of
the tenant as a whole (opening + inflows - outflows = closing, months tile in the tenant's
time zone, a month with no activity)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.http import StreamingHttpResponse
from django.test import Client
from django.utils import timezone

from devtools.demo_seed import staff_login_ensure
from payments.services.charges import payment_create
from reconciliation.books import month_end_report, trial_balance_summary
from tenants.models import Tenant
from tests.factories import CustomerFactory, MerchantFactory, TerminalFactory, fund
from tests.reconciliation.conftest import RECON_TENANT
from wallets.books import account_balance_before, month_bounds
from wallets.models import Account, AccountKind, LedgerTransactionKind, SystemRole
from wallets.selectors import account_of, system_account_get
from wallets.services.ledger import Leg, ledger_post

PASSWORD = "pw-books-123456"


def _client(username: str, role: str | None) -> Client:
    staff_login_ensure(username=username, password=PASSWORD, role=role, superuser=role is None)
    client = Client(HTTP_HOST=RECON_TENANT["domain"])
    assert client.login(username=username, password=PASSWORD)
    return client


def _stream(response: Any) -> list[list[str]]:
    assert isinstance(response, StreamingHttpResponse)
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.fixture
def zone_of(recon_tenant: Tenant) -> Iterator[Any]:
    """Set the tenant's time zone for the test (the row rolls back; the cached tenant object
    the connection holds is put back by hand)."""
    before = recon_tenant.time_zone

    def set_zone(name: str) -> None:
        Tenant.objects.filter(pk=recon_tenant.pk).update(time_zone=name)
        recon_tenant.time_zone = name
        connection.tenant.time_zone = name  # type: ignore[attr-defined]

    yield set_zone
    recon_tenant.time_zone = before


def test_trial_balance_page_sums_to_zero_names_system_accounts_and_needs_the_books_permission(world: dict[str, Any]) -> None:
    finance = _client("tb-finance", "finance")
    page = finance.get("/admin/reconciliation/reconciliationrun/trial-balance/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="trial-JPY"' in html and 'id="trial-total-JPY" data-minor="0"' in html and "(balanced)" in html
    for role in SystemRole.values:
        assert f'data-role="{role}"' in html, role
    assert "Fees" in html and "Payouts in transit" in html and "Carbon registry" in html
    assert world["alice"].id in html  # among the largest balances
    assert "DO NOT BALANCE" not in html
    for role in ("viewer", "operator"):
        other = _client(f"tb-{role}", role)
        assert other.get("/admin/reconciliation/reconciliationrun/trial-balance/").status_code == 403, role
        assert other.get("/admin/reconciliation/reconciliationrun/trial-balance.csv").status_code == 403, role
        assert other.get("/admin/reconciliation/reconciliationrun/month-end/").status_code == 403, role
        assert other.get("/admin/reconciliation/reconciliationrun/month-end.csv?asset=JPY").status_code == 403, role
    assert _client("tb-root", None).get("/admin/reconciliation/reconciliationrun/trial-balance/").status_code == 200


def test_trial_balance_csv_streams_every_account_and_a_zero_total(world: dict[str, Any]) -> None:
    finance = _client("tb-finance", "finance")
    rows = _stream(finance.get("/admin/reconciliation/reconciliationrun/trial-balance.csv"))
    assert rows[1] == ["asset", "account", "kind", "party", "system_account", "balance"]
    lines = [r for r in rows[2:] if r[1] != "TOTAL"]
    assert sum(int(r[5]) for r in lines if r[0] == "JPY") == 0
    assert ["JPY", "TOTAL", "", "", "", "0"] in rows
    alice = account_of(party=world["alice"])
    assert [r[5] for r in lines if r[1] == alice.id and r[0] == "JPY"] == [str(account_balance_before(account_id=alice.id, asset_code="JPY",
                                                                                    instant=timezone.now()))]
    assert any(r[4] == "Fees" or r[4].startswith("Staff adjustments") for r in lines)


def test_trial_balance_at_an_earlier_instant_and_bad_instants(world: dict[str, Any]) -> None:
    finance = _client("tb-finance", "finance")
    before = timezone.now()
    fund(world["bob"], 777)
    earlier = _stream(finance.get("/admin/reconciliation/reconciliationrun/trial-balance.csv", {"at": before.isoformat()}))
    now = _stream(finance.get("/admin/reconciliation/reconciliationrun/trial-balance.csv"))
    bob = account_of(party=world["bob"]).id
    assert int(next(r[5] for r in now if r[1] == bob and r[0] == "JPY")) - int(next(r[5] for r in earlier if r[1] == bob and r[0] == "JPY")) == 777
    for bad, words in [("yesterday", "ISO 8601"), ((timezone.now() + timedelta(hours=1)).isoformat(), "future"),
                       ("1999-01-01T00:00:00Z", "before the tenant existed")]:
        page = finance.get("/admin/reconciliation/reconciliationrun/trial-balance/", {"at": bad})
        assert page.status_code == 400 and words in page.content.decode(), bad
        assert finance.get("/admin/reconciliation/reconciliationrun/trial-balance.csv", {"at": bad}).status_code == 400


def test_an_unbalanced_asset_is_shown_loudly(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # ledger_post cannot write a transaction that does not sum to zero (and the ledger is
    # append-only), so the page is handed a summary with one cent astray.
    trials = trial_balance_summary(at=timezone.now())
    assert trials and all(t.balanced for t in trials)
    trials[0].total = 5
    monkeypatch.setattr("reconciliation.admin.trial_balance_summary", lambda *, at: trials)
    html = _client("tb-finance", "finance").get("/admin/reconciliation/reconciliationrun/trial-balance/").content.decode()
    assert f'id="trial-total-{trials[0].asset}" data-minor="5"' in html and "THE BOOKS DO NOT BALANCE" in html


def _participants_before(asset: str, instant: datetime) -> int:
    """The independent sum: every customer's and merchant's account, one by one."""
    accounts = Account.objects.exclude(kind=AccountKind.SYSTEM).values_list("id", flat=True)
    return sum(account_balance_before(account_id=a, asset_code=asset, instant=instant) for a in accounts)


def _post(kind: str, legs: list[Leg], at: datetime) -> None:
    ledger_post(kind=kind, reference=f"test_{kind}_{at.timestamp()}", legs=legs, created=at)


def test_month_end_report_identity_month_edges_in_the_tenants_zone_and_an_empty_month(recon_tenant: Tenant, zone_of: Any) -> None:
    zone_of("Europe/Berlin")
    customer, merchant = CustomerFactory(), MerchantFactory()
    cus, mer = account_of(party=customer), account_of(party=merchant)
    adjustments, fees = system_account_get(role=SystemRole.ADJUSTMENTS), system_account_get(role=SystemRole.FEES)
    transit = system_account_get(role=SystemRole.PAYOUTS_IN_TRANSIT)
    # 2026-10-31 23:30 UTC is 1 November 00:30 in Berlin (winter time): November's, not October's.
    _post(LedgerTransactionKind.ADJUSTMENT, [Leg(cus, "JPY", 10_000), Leg(adjustments, "JPY", -10_000)], datetime(2026, 10, 5, 12, tzinfo=UTC))
    _post(LedgerTransactionKind.PAYMENT, [Leg(cus, "JPY", -4_000), Leg(mer, "JPY", 3_900), Leg(fees, "JPY", 100)],
          datetime(2026, 10, 31, 22, 59, 59, tzinfo=UTC))  # 23:59:59 in Berlin: October
    _post(LedgerTransactionKind.PAYMENT, [Leg(cus, "JPY", -2_000), Leg(mer, "JPY", 1_950), Leg(fees, "JPY", 50)],
          datetime(2026, 10, 31, 23, 30, tzinfo=UTC))
    _post(LedgerTransactionKind.PAYOUT, [Leg(mer, "JPY", -5_000), Leg(transit, "JPY", 5_000)], datetime(2026, 11, 20, tzinfo=UTC))
    psp = system_account_get(role=SystemRole.PSP_FUNDING)
    # The payout is paid: in transit to the PSP, system accounts alone; the participants' money left with the payout.
    _post(LedgerTransactionKind.PAYOUT_PAID, [Leg(transit, "JPY", -5_000), Leg(psp, "JPY", 5_000)], datetime(2026, 11, 22, tzinfo=UTC))

    october = month_end_report(asset_code="JPY", month=date(2026, 10, 1))
    november = month_end_report(asset_code="JPY", month=date(2026, 11, 17))
    december = month_end_report(asset_code="JPY", month=date(2026, 12, 1))  # nothing happened in it
    assert october.start == datetime(2026, 9, 30, 22, tzinfo=UTC) and october.end == november.start == datetime(2026, 10, 31, 23, tzinfo=UTC)
    assert [(f.kind, f.amount) for f in october.inflows] == [("adjustment", 10_000)]
    assert [(f.kind, f.counterparty, f.amount) for f in october.outflows] == [("payment", "Fees", 100)]
    assert [(f.kind, f.amount) for f in november.outflows] == [("payment", 50), ("payout", 5_000)]
    assert november.inflows == []  # the paid payout is neither an inflow nor a second outflow
    for report in (october, november, december):
        assert report.opening + report.inflow_total - report.outflow_total == report.closing
        assert report.opening == _participants_before("JPY", report.start) and report.closing == _participants_before("JPY", report.end)
    assert october.closing == november.opening == 9_900 and november.closing == december.opening == 4_850
    assert december.opening == december.closing and not december.inflows and not december.outflows


def test_month_end_report_with_real_payments_this_month(world: dict[str, Any]) -> None:
    this_month = timezone.now().date()
    report = month_end_report(asset_code="JPY", month=this_month)
    assert report.opening + report.inflow_total - report.outflow_total == report.closing
    assert report.closing == _participants_before("JPY", report.end)
    payment_create(terminal=TerminalFactory(), customer=world["alice"], asset_code="JPY", amount=100)  # participants only: no flow
    again = month_end_report(asset_code="JPY", month=this_month)
    assert again.inflows == report.inflows and again.outflows == report.outflows and again.closing == report.closing


def test_month_end_pages_and_csv(world: dict[str, Any]) -> None:
    finance = _client("tb-finance", "finance")
    month = timezone.now().strftime("%Y-%m")
    page = finance.get("/admin/reconciliation/reconciliationrun/month-end/", {"asset": "JPY", "month": month})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="month-opening"' in html and 'id="month-closing"' in html and "in: adjustment" in html and "month-unbalanced" not in html
    assert finance.get("/admin/reconciliation/reconciliationrun/month-end/").status_code == 200  # blank: last month
    rows = _stream(finance.get("/admin/reconciliation/reconciliationrun/month-end.csv", {"asset": "JPY", "month": month}))
    amounts = {r[0]: int(r[3]) for r in rows if r[0] in ("opening", "closing")}
    flows = sum(int(r[3]) for r in rows if r[0] in ("inflow", "outflow"))
    assert amounts["opening"] + flows == amounts["closing"]
    future = (timezone.now() + timedelta(days=40)).strftime("%Y-%m")
    for params, words in [({"asset": "JPY", "month": "2026-13"}, "YYYY-MM"), ({"asset": "NOPE", "month": month}, "asset must be"),
                          ({"asset": "JPY", "month": future}, "not begun")]:
        assert finance.get("/admin/reconciliation/reconciliationrun/month-end/", params).status_code == 400
        response = finance.get("/admin/reconciliation/reconciliationrun/month-end.csv", params)
        assert response.status_code == 400 and words in response.content.decode(), params


def test_month_bounds_come_from_the_tenants_zone(recon_tenant: Tenant, zone_of: Any) -> None:
    zone_of("Asia/Tokyo")
    report = month_end_report(asset_code="JPY", month=date(2026, 12, 1))
    assert (report.start, report.end) == month_bounds(month=date(2026, 12, 1), zone=ZoneInfo("Asia/Tokyo"))
    assert report.start == datetime(2026, 11, 30, 15, tzinfo=UTC)


def test_a_month_before_the_tenant_or_out_of_the_calendar_is_a_400(world: dict[str, Any], recon_tenant: Tenant, zone_of: Any) -> None:
    zone_of("Asia/Tokyo")  # 0001-01's local midnight is in year 0 in UTC
    finance = _client("tb-finance", "finance")
    created = recon_tenant.created.astimezone(ZoneInfo("Asia/Tokyo"))
    before = (created.date().replace(day=1) - timedelta(days=1)).strftime("%Y-%m")
    for month in ("0001-01", "1999-12", before):
        params = {"asset": "JPY", "month": month}
        page = finance.get("/admin/reconciliation/reconciliationrun/month-end/", params)
        assert page.status_code == 400 and "before the tenant existed" in page.content.decode(), month
        response = finance.get("/admin/reconciliation/reconciliationrun/month-end.csv", params)
        assert response.status_code == 400 and "before the tenant existed" in response.content.decode(), month
    assert finance.get("/admin/reconciliation/reconciliationrun/month-end/", {"asset": "JPY", "month": created.strftime("%Y-%m")}).status_code == 200
    assert finance.get("/admin/reconciliation/reconciliationrun/month-end/").status_code == 200  # blank: last month, or the tenant's first
