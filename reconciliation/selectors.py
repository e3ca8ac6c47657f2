"""Reads for the reconciliation dashboard and its CSV exports (current tenant). The CSV
rows are generators over `.iterator()`, so an export streams with flat memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from payments.models import Payment, Refund
from reconciliation.charts import Chart, Series
from reconciliation.models import ReconciliationFinding, ReconciliationRun, RunStatus
from tenants.selectors import tenant_zone
from wallets.models import Asset, LedgerEntry

DASHBOARD_DAYS = 30
DASHBOARD_RUNS = 30


def reconciliation_run_latest(*, finished: bool = True) -> ReconciliationRun | None:
    runs = ReconciliationRun.objects.all()
    if finished:
        runs = runs.filter(status__in=[RunStatus.CLEAN, RunStatus.FINDINGS, RunStatus.FAILED])
    return runs.order_by("-created", "-id").first()


def reconciliation_findings_by_kind(*, run: ReconciliationRun) -> list[dict[str, Any]]:
    """Findings per kind of one run: kind, severity and count found (the report counts past
    the storage cap too)."""
    severities = dict(run.findings.order_by().values_list("kind", "severity").distinct())
    by_kind = sorted(run.report.get("by_kind", {}).items())
    return [{"kind": kind, "severity": severities.get(kind, ""), "count": int(n)} for kind, n in by_kind]


def dashboard_volume_charts(*, now: datetime | None = None, days: int = DASHBOARD_DAYS) -> list[Chart]:
    """Daily payment volume per asset (major units), daily refunds, and daily fee revenue per
    asset (fees taken less fees refunds gave back, on the day of each), over `days`. A day is
    the tenant's local day (its time zone): PostgreSQL truncates each row's instant `AT TIME
    ZONE` the tenant's zone, and the window starts at local midnight."""
    zone = tenant_zone()
    today = (now or timezone.now()).astimezone(zone).date()
    axis = [today - timedelta(days=days - 1 - i) for i in range(days)]
    since = datetime.combine(axis[0], datetime.min.time(), tzinfo=zone)
    exponents = dict(Asset.objects.values_list("code", "exponent"))
    labels = [d.strftime("%m-%d") for d in axis]

    def daily(rows: QuerySet[Any], asset_field: str, field: str = "amount") -> tuple[dict[str, dict[date, int]], dict[str, dict[date, int]]]:
        """Sums of `field` and counts, by asset and day (one SQL aggregate)."""
        totals: dict[str, dict[date, int]] = {}
        counts: dict[str, dict[date, int]] = {}
        for row in (
            rows.filter(created__gte=since).annotate(day=TruncDate("created", tzinfo=zone)).order_by()
            .values("day", asset_code=F(asset_field)).annotate(total=Sum(field), n=Count("id"))
        ):
            totals.setdefault(row["asset_code"], {})[row["day"]] = int(row["total"] or 0)
            counts.setdefault(row["asset_code"], {})[row["day"]] = int(row["n"])
        return totals, counts

    def amount_chart(slug: str, title: str, name: str, asset: str, by_day: dict[date, int]) -> Chart:
        exponent = int(exponents.get(asset, 0))
        return Chart(
            slug=f"{slug}-{asset.lower()}", title=f"{title}, {asset}", labels=labels, kind="bar", unit=asset,
            series=[Series(name=f"{asset} {name}", values=[Decimal(by_day.get(d, 0)).scaleb(-exponent) for d in axis])],
        )

    volume, counts = daily(Payment.objects.all(), "asset_id")
    charts: list[Chart] = []
    for asset in sorted(volume):
        charts.append(amount_chart("volume", "Daily payment volume", "paid", asset, volume[asset]))
        charts.append(Chart(
            slug=f"payments-{asset.lower()}", title=f"Daily payments, {asset}", labels=labels, kind="line", unit="count",
            series=[Series(name="payments", values=[counts[asset].get(d, 0) for d in axis])],
        ))
    if not volume:
        charts.append(Chart(slug="volume", title="Daily payment volume", labels=labels, kind="bar", series=[]))
    refunded, refund_counts = daily(Refund.objects.all(), "payment__asset_id")
    charts.append(Chart(
        slug="refunds", title="Daily refunds", labels=labels, kind="bar", unit="count",
        series=[Series(name=f"{asset} refunds", values=[refund_counts[asset].get(d, 0) for d in axis]) for asset in sorted(refund_counts)],
    ))
    charts += [amount_chart("refunds", "Daily refunded amount", "refunded", asset, refunded[asset]) for asset in sorted(refunded)]
    taken, _ = daily(Payment.objects.filter(fee__gt=0), "asset_id", "fee")
    returned, _ = daily(Refund.objects.filter(fee__gt=0), "payment__asset_id", "fee")
    for asset in sorted(taken.keys() | returned.keys()):
        revenue = {day: taken.get(asset, {}).get(day, 0) - returned.get(asset, {}).get(day, 0) for day in axis}
        charts.append(amount_chart("fees", "Daily fee revenue", "fees", asset, revenue))
    return charts


def _delta(values: list[float]) -> list[float]:
    """Increase between consecutive snapshots of a per-process counter (a restart resets it)."""
    return [0.0 if i == 0 else (value - values[i - 1] if value >= values[i - 1] else value) for i, value in enumerate(values)]


def dashboard_run_charts(*, runs: int = DASHBOARD_RUNS) -> list[Chart]:
    """Series stored on the last `runs` finished runs: outbox lag and backlog, idempotency
    (replays and conflicts, stuck and failed keys), and findings per run."""
    recent = list(
        ReconciliationRun.objects.filter(status__in=[RunStatus.CLEAN, RunStatus.FINDINGS]).order_by("-created", "-id")
        .values("id", "created", "metrics", "findings_count")[:runs]
    )[::-1]
    labels = [f"#{r['id']} {timezone.localtime(r['created']).strftime('%H:%M')}" for r in recent]

    def metric(name: str) -> list[float]:
        return [float(r["metrics"].get(name, 0) or 0) for r in recent]

    return [
        Chart(slug="outbox-lag", title="Outbox lag at each run", labels=labels, unit="seconds",
              series=[Series(name="lag (s)", values=metric("outbox_lag_seconds"))]),
        Chart(slug="outbox-backlog", title="Outbox backlog and dead letters at each run", labels=labels, unit="events",
              series=[Series(name="unpublished", values=metric("outbox_unpublished")),
                      Series(name="dead letters", values=metric("outbox_dead_letters")),
                      Series(name="webhooks failed", values=metric("webhook_failed"))]),
        Chart(slug="idempotency-replays", title="Idempotency replays and conflicts between runs", labels=labels, kind="bar", unit="count",
              series=[Series(name="replays", values=_delta(metric("process_idempotency_replays_total"))),
                      Series(name="conflicts (409/422)", values=_delta(metric("process_idempotency_conflicts_total")))]),
        Chart(slug="idempotency-keys", title="Idempotency keys at each run", labels=labels, unit="records",
              series=[Series(name="stuck in flight", values=metric("idempotency_stuck")),
                      Series(name="failed (retryable)", values=metric("idempotency_failed_retryable"))]),
        Chart(slug="findings", title="Findings per run", labels=labels, kind="bar", unit="count",
              series=[Series(name="findings", values=[float(r["findings_count"]) for r in recent])]),
    ]


FINDINGS_CSV_HEADER = ["run", "finding", "check", "kind", "severity", "summary", "refs", "details"]
LEDGER_CSV_HEADER = ["entry", "created", "transaction", "transaction_kind", "reference", "account", "asset", "amount"]


def reconciliation_findings_csv_rows(*, run: ReconciliationRun, chunk_size: int = 2000) -> Iterator[list[Any]]:
    """The report of one run as CSV rows: a header, one summary row per check, then every finding."""
    yield ["run", run.pk, "status", run.status, "trigger", run.trigger, "created", run.created.isoformat(), "duration_ms", run.duration_ms]
    yield ["check", "findings", "stored", "seconds", "stats"]
    for name, entry in run.report.get("checks", {}).items():
        yield [name, entry.get("findings"), entry.get("stored"), entry.get("seconds"), json.dumps(entry.get("stats", {}), sort_keys=True)]
    yield FINDINGS_CSV_HEADER
    findings = ReconciliationFinding.objects.filter(run=run).order_by("id")
    for f in findings.iterator(chunk_size=chunk_size):
        yield [run.pk, f.pk, f.check_name, f.kind, f.severity, f.summary,
               " ".join(f"{r['app_label']}.{r['model']}:{r['pk']}" for r in f.refs), json.dumps(f.details, sort_keys=True)]


def ledger_csv_rows(*, start: date, end: date, chunk_size: int = 2000) -> Iterator[list[Any]]:
    """Ledger entries created on days start..end (inclusive), oldest first, amounts in minor units."""
    since = timezone.make_aware(datetime.combine(start, datetime.min.time()))
    until = timezone.make_aware(datetime.combine(end + timedelta(days=1), datetime.min.time()))
    yield LEDGER_CSV_HEADER
    entries = (
        LedgerEntry.objects.filter(created__gte=since, created__lt=until).order_by("created", "id")
        .values_list("id", "created", "transaction_id", "transaction__kind", "transaction__reference", "account_id", "asset_id", "amount")
    )
    for entry_id, created, txn, kind, reference, account, asset, amount in entries.iterator(chunk_size=chunk_size):
        yield [entry_id, created.isoformat(), txn, kind, reference, account, asset, amount]
