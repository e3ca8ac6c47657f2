"""Reconciliation in the admin: the dashboard renders its SVG charts from stored
runs, "Run now" runs one (eager Celery in tests), findings link to the rows they concern,
and the CSV exports of a report and of the ledger stream."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.http import StreamingHttpResponse
from django.test import Client
from django.utils import timezone

from idempotency.models import IdempotencyRecord, RecordState
from reconciliation.charts import Chart, Series, chart_svg
from reconciliation.models import ReconciliationRun, RunStatus, RunTrigger
from tests.reconciliation.conftest import RECON_TENANT, reconcile
from wallets.models import LedgerEntry


@pytest.fixture
def staff_client(recon_tenant: Any) -> Client:
    get_user_model().objects.create_superuser(username="recon-root", password="pw-123456")
    client = Client(HTTP_HOST=RECON_TENANT["domain"])
    assert client.login(username="recon-root", password="pw-123456")
    return client


def _stream(response: Any) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()


def _stuck_key() -> None:
    now = timezone.now()
    IdempotencyRecord.objects.create(
        principal_id="ter_x", key="=HYPERLINK(1)", scope="terminal", fingerprint="f" * 64, state=RecordState.IN_FLIGHT,
        lease_expires_at=now - timedelta(minutes=5), request_id="req_1", created=now, updated=now,
    )


def test_dashboard_renders_charts_and_the_latest_run(world: dict[str, Any], staff_client: Client) -> None:
    reconcile()
    _stuck_key()
    run = reconcile()
    page = staff_client.get("/admin/reconciliation/reconciliationrun/dashboard/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="latest-run"' in html and f"Run {run.pk}" in html and 'id="latest-run-findings">1<' in html
    assert 'data-kind="idempotency_stuck_in_flight"' in html
    for slug in ("volume-jpy", "payments-jpy", "refunds", "refunds-jpy", "outbox-lag", "outbox-backlog", "idempotency-replays",
                 "idempotency-keys", "findings"):
        assert '<svg class="tally-chart' in html and f'id="chart-{slug}"' in html, slug
    assert 'data-points="2"' in html  # the run charts plot the two runs
    assert "<script" not in html.split('id="reconciliation-dashboard"')[1]  # server-side SVG, nothing from a CDN
    assert "http://" not in html.split('id="reconciliation-dashboard"')[1].replace("http://www.w3.org/2000/svg", "")


def test_dashboard_with_no_runs(recon_tenant: Any, staff_client: Client) -> None:
    html = staff_client.get("/admin/reconciliation/reconciliationrun/dashboard/").content.decode()
    assert 'id="latest-run-none"' in html and "no data yet" in html


def test_run_now_button_runs_a_reconciliation(world: dict[str, Any], staff_client: Client, django_capture_on_commit_callbacks: Any) -> None:
    listing = staff_client.get("/admin/reconciliation/reconciliationrun/")
    assert listing.status_code == 200 and b'id="reconciliation-run-now"' in listing.content
    assert staff_client.get("/admin/reconciliation/reconciliationrun/run-now/").status_code == 405  # POST only
    with django_capture_on_commit_callbacks(execute=True):
        r = staff_client.post("/admin/reconciliation/reconciliationrun/run-now/")
    assert r.status_code == 302
    run = ReconciliationRun.objects.get()
    assert run.trigger == RunTrigger.ADMIN and run.requested_by == "recon-root" and run.status == RunStatus.CLEAN
    page = staff_client.get(f"/admin/reconciliation/reconciliationrun/{run.pk}/change/")
    assert page.status_code == 200 and b'id="run-report"' in page.content and b"ledger_balances" in page.content


def test_run_now_needs_the_permission(world: dict[str, Any], recon_tenant: Any) -> None:
    user = get_user_model().objects.create_user(username="viewer", password="pw-123456", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_reconciliationrun"))
    client = Client(HTTP_HOST=RECON_TENANT["domain"])
    assert client.login(username="viewer", password="pw-123456")
    assert client.get("/admin/reconciliation/reconciliationrun/dashboard/").status_code == 200
    assert b'id="reconciliation-run-now"' not in client.get("/admin/reconciliation/reconciliationrun/").content
    assert client.post("/admin/reconciliation/reconciliationrun/run-now/").status_code == 403
    assert client.get("/admin/reconciliation/reconciliationrun/ledger.csv?start=2020-01-01&end=2030-01-01").status_code == 403
    assert not ReconciliationRun.objects.exists()


def test_findings_list_links_to_what_they_concern(world: dict[str, Any], staff_client: Client) -> None:
    _stuck_key()
    run = reconcile()
    page = staff_client.get(f"/admin/reconciliation/reconciliationfinding/?run__id__exact={run.pk}")
    assert page.status_code == 200
    record = IdempotencyRecord.objects.get()
    # The idempotency record has an admin page: the finding links to it.
    assert f'href="/admin/idempotency/idempotencyrecord/{record.pk}/change/"'.encode() in page.content


def test_report_csv_streams(world: dict[str, Any], staff_client: Client) -> None:
    _stuck_key()
    run = reconcile()
    response = staff_client.get(f"/admin/reconciliation/reconciliationrun/{run.pk}/report.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(_stream(response))))
    assert rows[0][:4] == ["run", str(run.pk), "status", "findings"]
    assert ["idempotency_stuck", "1", "1"] == rows[[r[0] for r in rows].index("idempotency_stuck")][:3]
    finding = rows[-1]
    assert finding[3] == "idempotency_stuck_in_flight" and finding[6].startswith("idempotency.idempotencyrecord:")
    assert '"key": "=HYPERLINK(1)"' in finding[7]
    assert all(not cell.startswith("=") for row in rows for cell in row)  # no cell a spreadsheet would run


def test_ledger_csv_for_a_date_range_streams(world: dict[str, Any], staff_client: Client) -> None:
    today = timezone.localdate()
    response = staff_client.get(f"/admin/reconciliation/reconciliationrun/ledger.csv?start={today - timedelta(days=1)}&end={today}")
    assert response.status_code == 200
    rows = list(csv.reader(io.StringIO(_stream(response))))
    assert rows[0] == ["entry", "created", "transaction", "transaction_kind", "reference", "account", "asset", "amount"]
    assert len(rows) - 1 == LedgerEntry.objects.count()
    assert sum(int(r[7]) for r in rows[1:]) == 0  # double entry: the export sums to zero
    assert {r[3] for r in rows[1:]} >= {"payment", "refund", "transfer", "adjustment"}
    old = staff_client.get("/admin/reconciliation/reconciliationrun/ledger.csv?start=2001-01-01&end=2001-01-31")
    assert list(csv.reader(io.StringIO(_stream(old)))) == [rows[0]]


@pytest.mark.parametrize("query", ["", "?start=yesterday&end=2024-01-01", "?start=2024-02-01&end=2024-01-01"])
def test_ledger_csv_bad_dates_are_400(recon_tenant: Any, staff_client: Client, query: str) -> None:
    r = staff_client.get(f"/admin/reconciliation/reconciliationrun/ledger.csv{query}")
    assert r.status_code == 400


def test_chart_svg_escapes_and_scales() -> None:
    svg = chart_svg(Chart(slug="x", title="<b>&", labels=["a", "b"], series=[Series(name="s<", values=[0, 250])], kind="bar"))
    assert svg.startswith('<svg class="tally-chart tally-chart-bar" id="chart-x"')
    assert "<b>" not in svg and "&lt;b&gt;&amp;" in svg and "s&lt;" in svg
    assert ">500<" in svg  # the axis tops out at a round number above the largest value
    assert svg.count("<rect") == 2 + 1  # two bars and the legend's swatch


def test_run_series_plot_idempotency_counters_between_runs(world: dict[str, Any]) -> None:
    from idempotency import metrics
    from reconciliation.selectors import dashboard_run_charts

    reconcile()
    metrics.IDEMPOTENCY_REPLAYS.labels(source="db").inc(5)
    metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS.inc(2)
    reconcile()
    charts = {chart.slug: chart for chart in dashboard_run_charts()}
    replays, conflicts = charts["idempotency-replays"].series
    assert list(replays.values) == [0.0, 5.0] and list(conflicts.values) == [0.0, 2.0]
    assert len(charts["outbox-lag"].labels) == 2


def test_run_now_redirects_only_to_this_site(world: dict[str, Any], staff_client: Client) -> None:
    r = staff_client.post("/admin/reconciliation/reconciliationrun/run-now/", {"next": "https://evil.example/"})
    assert r.status_code == 302 and r["Location"] == "/admin/reconciliation/reconciliationrun/"
    r = staff_client.post("/admin/reconciliation/reconciliationrun/run-now/", {"next": "/admin/reconciliation/reconciliationrun/dashboard/"})
    assert r["Location"] == "/admin/reconciliation/reconciliationrun/dashboard/"
