"""Reconciliation in the tenant admin: runs (read-only, "Run now"), findings with links to
the rows they concern, the dashboard (server-side SVG charts) and the streamed CSV
exports of a run's report and of the ledger for a date range."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseBase, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from reconciliation.books import (
    TRIAL_BALANCE_TOP,
    AssetTrial,
    MonthEndReport,
    assets_known,
    month_end_csv_rows,
    month_end_report,
    trial_balance_csv_rows,
    trial_balance_summary,
)
from reconciliation.charts import chart_svg
from reconciliation.models import ReconciliationFinding, ReconciliationRun, RunTrigger
from reconciliation.selectors import (
    dashboard_run_charts,
    dashboard_volume_charts,
    ledger_csv_rows,
    reconciliation_findings_by_kind,
    reconciliation_findings_csv_rows,
    reconciliation_run_latest,
)
from reconciliation.services import reconciliation_run_request
from reconciliation.tasks import reconciliation_run_enqueue_on_commit
from tenants.selectors import tenant_current, tenant_zone
from wallets.adminkit import ReadOnlyMixin
from wallets.models import Asset
from wallets.money import money_format

RUN_PERMISSION = "reconciliation.add_reconciliationrun"
LEDGER_EXPORT_PERMISSION = "wallets.view_ledgerentry"
BOOKS_PERMISSION = "reconciliation.view_books"


def ref_link(ref: dict[str, str]) -> SafeString:
    """An admin link to the row a finding names, or its name when that model has no admin page."""
    label = f"{ref['model']} {ref['pk']}"
    try:
        url = reverse(f"admin:{ref['app_label']}_{ref['model']}_change", args=[ref["pk"]])
    except NoReverseMatch:
        return format_html('<span class="tally-ref">{}</span>', label)
    return format_html('<a class="tally-ref" href="{}">{}</a>', url, label)


class _Echo:
    def write(self, value: str) -> str:
        return value


_FORMULA_STARTS = ("=", "+", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A spreadsheet must not run a cell as a formula (an idempotency key is client text)."""
    if isinstance(value, str) and value and (value.startswith(_FORMULA_STARTS) or (value[0] == "-" and not value[1:2].isdigit())):
        return "'" + value
    return value


def csv_streaming_response(rows: Iterable[list[Any]], filename: str) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    lines = (writer.writerow([_cell(v) for v in row]) for row in rows)
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(ReadOnlyMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "created", "trigger", "status", "findings_count", "duration_ms", "requested_by", "findings_link", "csv_link")
    list_filter = ("status", "trigger")
    date_hierarchy = "created"
    fields = ("id", "trigger", "status", "requested_by", "created", "started_at", "finished_at", "duration_ms", "findings_count",
              "report_table", "metrics", "error", "findings_link", "csv_link")
    show_full_result_count = False

    @admin.display(description="report")
    def report_table(self, run: ReconciliationRun) -> SafeString:
        rows = format_html_join(
            "", '<tr class="tally-check"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            ((name, e.get("findings"), e.get("stored"), e.get("seconds"), e.get("stats")) for name, e in run.report.get("checks", {}).items()),
        )
        return format_html('<table id="run-report"><tr><th>check</th><th>findings</th><th>stored</th><th>seconds</th>'
                           "<th>stats</th></tr>{}</table>", rows)

    @admin.display(description="findings")
    def findings_link(self, run: ReconciliationRun) -> SafeString:
        url = reverse("admin:reconciliation_reconciliationfinding_changelist") + f"?run__id__exact={run.pk}"
        return format_html('<a href="{}">{} finding(s)</a>', url, run.findings_count)

    @admin.display(description="CSV")
    def csv_link(self, run: ReconciliationRun) -> SafeString:
        return format_html('<a class="tally-csv" href="{}">report.csv</a>', reverse("admin:reconciliation_run_csv", args=[run.pk]))

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("dashboard/", wrap(self.dashboard_view), name="reconciliation_dashboard"),
            path("run-now/", wrap(require_POST(self.run_now_view)), name="reconciliation_run_now"),
            path("<int:run_id>/report.csv", wrap(self.run_csv_view), name="reconciliation_run_csv"),
            path("ledger.csv", wrap(self.ledger_csv_view), name="reconciliation_ledger_csv"),
            path("trial-balance/", wrap(self.trial_balance_view), name="reconciliation_trial_balance"),
            path("trial-balance.csv", wrap(self.trial_balance_csv_view), name="reconciliation_trial_balance_csv"),
            path("month-end/", wrap(self.month_end_view), name="reconciliation_month_end"),
            path("month-end.csv", wrap(self.month_end_csv_view), name="reconciliation_month_end_csv"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra = {**(extra_context or {}), "can_run_now": request.user.has_perm(RUN_PERMISSION)}
        return super().changelist_view(request, extra_context=extra)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        latest = reconciliation_run_latest()
        today = timezone.localdate()
        context = {
            **self.admin_site.each_context(request),
            "title": "Reconciliation dashboard",
            "opts": self.model._meta,
            "latest": latest,
            "by_kind": reconciliation_findings_by_kind(run=latest) if latest else [],
            "volume_charts": [chart_svg(chart) for chart in dashboard_volume_charts()],
            "run_charts": [chart_svg(chart) for chart in dashboard_run_charts()],
            "can_run_now": request.user.has_perm(RUN_PERMISSION),
            "ledger_start": (today - timedelta(days=7)).isoformat(),
            "ledger_end": today.isoformat(),
        }
        return TemplateResponse(request, "admin/reconciliation/dashboard.html", context)

    def run_now_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(RUN_PERMISSION):
            raise PermissionDenied
        run = reconciliation_run_request(trigger=RunTrigger.ADMIN, requested_by=request.user.get_username())
        reconciliation_run_enqueue_on_commit(run_id=run.pk)
        self.message_user(request, f"Reconciliation run {run.pk} requested; it runs in the background.", messages.SUCCESS)
        after = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(after, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            after = reverse("admin:reconciliation_reconciliationrun_changelist")
        return HttpResponseRedirect(after)

    def run_csv_view(self, request: HttpRequest, run_id: int) -> HttpResponseBase:
        run = ReconciliationRun.objects.filter(pk=run_id).first()
        if run is None or not self.has_view_permission(request, run):
            raise PermissionDenied
        return csv_streaming_response(reconciliation_findings_csv_rows(run=run), f"reconciliation-run-{run.pk}.csv")

    def ledger_csv_view(self, request: HttpRequest) -> HttpResponseBase:
        if not request.user.has_perm(LEDGER_EXPORT_PERMISSION):
            raise PermissionDenied
        try:
            start = date.fromisoformat(request.GET.get("start", ""))
            end = date.fromisoformat(request.GET.get("end", ""))
        except ValueError:
            return HttpResponseBadRequest("start and end must be dates (YYYY-MM-DD)", content_type="text/plain")
        if end < start:
            return HttpResponseBadRequest("end must not be before start", content_type="text/plain")
        return csv_streaming_response(ledger_csv_rows(start=start, end=end), f"ledger-{start}-{end}.csv")

    # The books: the trial balance at an instant and the month-end report (reconciliation.books).

    def _books_context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        if not request.user.has_perm(BOOKS_PERMISSION):
            raise PermissionDenied
        return {**self.admin_site.each_context(request), "title": title, "opts": self.model._meta, "zone": tenant_zone().key}

    def trial_balance_view(self, request: HttpRequest) -> HttpResponse:
        context = self._books_context(request, "Trial balance")
        at, error = books_instant(request.GET.get("at", ""))
        context.update(at=at, at_text=request.GET.get("at", ""), error=error, top=TRIAL_BALANCE_TOP)
        if error is None:
            assert at is not None
            assets = {a.code: a for a in Asset.objects.all()}
            trials = trial_balance_summary(at=at)
            context["trials"] = [_trial_rows(trial, _formatter(assets.get(trial.asset))) for trial in trials]
            context["at_local"] = at.astimezone(tenant_zone())
        return TemplateResponse(request, "admin/reconciliation/trial_balance.html", context, status=400 if error else 200)

    def trial_balance_csv_view(self, request: HttpRequest) -> HttpResponseBase:
        self._books_context(request, "")
        at, error = books_instant(request.GET.get("at", ""))
        if error is not None:
            return HttpResponseBadRequest(error, content_type="text/plain")
        assert at is not None
        return csv_streaming_response(trial_balance_csv_rows(at=at), f"trial-balance-{at.astimezone(UTC):%Y%m%dT%H%M%S}Z.csv")

    def month_end_view(self, request: HttpRequest) -> HttpResponse:
        context = self._books_context(request, "Month-end report")
        assets = assets_known()
        asset_code = request.GET.get("asset") or (assets[0].code if assets else "")
        month, error = books_month(request.GET.get("month", ""), asset_code=asset_code, assets=assets)
        context.update(assets=assets, asset_code=asset_code, month_text=request.GET.get("month", ""), error=error)
        report = None
        if error is None:
            assert month is not None
            report, error = _month_end_report(asset_code=asset_code, month=month)
        context["error"] = error
        if report is not None:
            assert month is not None
            zone = tenant_zone()
            fmt = _formatter(next(a for a in assets if a.code == asset_code))
            context.update(
                report=report, month=month, start_local=report.start.astimezone(zone), end_local=report.end.astimezone(zone),
                opening=fmt(report.opening), closing=fmt(report.closing), inflow_total=fmt(report.inflow_total),
                outflow_total=fmt(report.outflow_total), balanced=report.opening + report.inflow_total - report.outflow_total == report.closing,
                inflows=[(f.kind, f.counterparty, fmt(f.amount)) for f in report.inflows],
                outflows=[(f.kind, f.counterparty, fmt(f.amount)) for f in report.outflows],
            )
        return TemplateResponse(request, "admin/reconciliation/month_end.html", context, status=400 if error else 200)

    def month_end_csv_view(self, request: HttpRequest) -> HttpResponseBase:
        self._books_context(request, "")
        assets = assets_known()
        asset_code = request.GET.get("asset", "")
        month, error = books_month(request.GET.get("month", ""), asset_code=asset_code, assets=assets)
        if error is None:
            assert month is not None
            report, error = _month_end_report(asset_code=asset_code, month=month)
        if error is not None:
            return HttpResponseBadRequest(error, content_type="text/plain")
        assert month is not None and report is not None
        return csv_streaming_response(month_end_csv_rows(report=report), f"month-end-{asset_code}-{month:%Y-%m}.csv")


def _month_end_report(*, asset_code: str, month: date) -> tuple[MonthEndReport | None, str | None]:
    """The report, or the message why the month cannot be shown (a bound outside the calendar
    in the tenant's zone: books_month refuses such months already; this keeps it a 400)."""
    try:
        report = month_end_report(asset_code=asset_code, month=month)
    except (ValueError, OverflowError):
        return None, "month is outside the calendar's range in the tenant's time zone"
    return report, None


def _trial_rows(trial: AssetTrial, fmt: Callable[[int], str]) -> dict[str, Any]:
    """One asset's trial balance as the page shows it (amounts formatted in the asset's units)."""
    return {
        "asset": trial.asset, "accounts": trial.accounts, "balanced": trial.balanced, "total": fmt(trial.total),
        "debits": fmt(trial.debits), "credits": fmt(trial.credits), "total_minor": trial.total,
        "system": [(role, label, fmt(balance)) for role, label, balance in trial.system],
        "top": [(line.account, line.kind, line.party, fmt(line.balance)) for line in trial.top],
    }


def _formatter(asset: Asset | None) -> Callable[[int], str]:
    if asset is None:
        return lambda amount: str(amount)
    return lambda amount: money_format(amount=amount, code=asset.code, kind=asset.kind, exponent=asset.exponent)


def books_instant(text: str) -> tuple[datetime | None, str | None]:
    """The instant a books page asks for: now when blank; an ISO 8601 instant, a wall clock
    without an offset read in the tenant's time zone. Refused (the message): malformed, in
    the future (the books of then are not written yet), or before the tenant existed."""
    now = timezone.now()
    if not text.strip():
        return now, None
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        return None, "at must be an ISO 8601 instant, e.g. 2026-11-30T23:59:59+09:00"
    if at.tzinfo is None:
        at = at.replace(tzinfo=tenant_zone())
    if at > now:
        return None, "at is in the future"
    created = tenant_current().created
    if at < created:
        return None, f"at is before the tenant existed (created {created.isoformat()})"
    return at, None


def books_month(text: str, *, asset_code: str, assets: list[Asset]) -> tuple[date | None, str | None]:
    """The month a month-end report asks for (YYYY-MM; blank: last month in the tenant's
    zone, or the first month of a tenant younger than that) and an asset it knows. Refused:
    a month that has not begun (the current one is the month so far) or that ended before
    the tenant existed (as books_instant; year 1 would also fall outside the calendar in a
    zone east of UTC)."""
    if asset_code not in {a.code for a in assets}:
        return None, "asset must be one of the tenant's assets: " + ", ".join(a.code for a in assets)
    zone = tenant_zone()
    today = timezone.now().astimezone(zone).date()
    created = tenant_current().created
    first = created.astimezone(zone).date().replace(day=1)
    if not text.strip():
        return max((today.replace(day=1) - timedelta(days=1)).replace(day=1), first), None
    try:
        month = datetime.strptime(text.strip(), "%Y-%m").date()
    except ValueError:
        return None, "month must be YYYY-MM"
    if month > today:
        return None, "month has not begun"
    if month < first:
        return None, f"month is before the tenant existed (created {created.isoformat()})"
    return month, None


@admin.register(ReconciliationFinding)
class ReconciliationFindingAdmin(ReadOnlyMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "run", "kind", "severity", "summary", "links")
    list_filter = ("kind", "severity", "check_name")
    search_fields = ("summary",)
    list_select_related = ("run",)
    fields = ("id", "run", "check_name", "kind", "severity", "summary", "details", "links", "created")
    show_full_result_count = False

    @admin.display(description="concerns")
    def links(self, finding: ReconciliationFinding) -> SafeString:
        return format_html_join(" ", "{}", ((ref_link(ref),) for ref in finding.refs))
