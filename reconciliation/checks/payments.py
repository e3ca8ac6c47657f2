"""Checks on the payments app's data, and the per-run metrics the dashboard charts."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from django.db.models import Count, F, Min, QuerySet, Sum, Window
from django.db.models.functions import Lag
from prometheus_client import CollectorRegistry, Counter, multiprocess

from idempotency import metrics as idempotency_metrics
from idempotency.models import IdempotencyRecord, RecordState
from payments.errors import PspNotConfigured, PspUnavailable
from payments.gateways.base import GatewayError
from payments.gateways.registry import gateway_build
from payments.models import GatewayAccount, OutboxEvent, Payment
from payments.selectors import (
    HeldAtPspExplained,
    gateway_account_active,
    payout_destinations_page,
    payout_settlement_lines,
    payout_statuses,
    payouts_held_at_psp_explained,
    payouts_in_review_since,
    payouts_in_transit_overdue,
    payouts_in_transit_totals,
    payouts_returns_owed_since,
    topup_settlement_lines,
    topups_charged_uncredited,
)
from reconciliation.checks.base import CheckContext, Discrepancy, ObjectRef, Severity
from reconciliation.models import ReconciliationRun
from wallets.models import Balance, SystemRole
from wallets.selectors import account_balance_lines, system_account_get


def duplicate_charges_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """A payment by the same customer to the same merchant for the same amount and asset within
    `duplicate_window_seconds` of the previous one, unless either was refunded in full."""
    window: dict[str, Any] = {
        "partition_by": [F("customer_id"), F("merchant_id"), F("asset_id"), F("amount")],
        "order_by": [F("created").asc(), F("id").asc()],
    }
    suspects = (
        Payment.objects.order_by()
        .annotate(
            previous_id=Window(Lag("id"), **window),
            previous_created=Window(Lag("created"), **window),
            previous_refunded=Window(Lag("amount_refunded"), **window),
        )
        .filter(previous_created__isnull=False, created__lte=F("previous_created") + timedelta(seconds=ctx.duplicate_window_seconds))
        .exclude(amount_refunded=F("amount"))
        .exclude(previous_refunded=F("amount"))
        .values_list("id", "previous_id", "customer_id", "merchant_id", "asset_id", "amount", "amount_refunded", "created", "previous_created")
        .order_by("created", "id")
    )
    for pay_id, previous_id, customer, merchant, asset, amount, refunded, created, previous_created in suspects.iterator(chunk_size=ctx.chunk_size):
        seconds = (created - previous_created).total_seconds()
        yield Discrepancy(
            kind="duplicate_charge_suspect",
            severity=Severity.WARNING,
            summary=f"{pay_id} charged {customer} {amount} {asset} at {merchant} {seconds:.0f} s after {previous_id}",
            details={"payment": pay_id, "previous_payment": previous_id, "customer": customer, "merchant": merchant, "asset": asset,
                     "amount": int(amount), "amount_refunded": int(refunded), "seconds_apart": seconds,
                     "created": created.isoformat(), "previous_created": previous_created.isoformat()},
            refs=(ObjectRef("payments", "payment", pay_id), ObjectRef("payments", "payment", str(previous_id)),
                  ObjectRef("wallets", "customer", customer), ObjectRef("wallets", "merchant", merchant)),
        )
    ctx.stats["payments"] = Payment.objects.count()


def fee_account_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Per asset, the fees account's balance (its shards summed) against the fees payments
    took less what refunds gave back."""
    held = Balance.objects.filter(account__system_role=SystemRole.FEES).order_by().values("asset_id").annotate(total=Sum("balance"))
    kept = Payment.objects.filter(fee__gt=0).order_by().values("asset_id").annotate(total=Sum(F("fee") - F("fee_refunded")))
    balances = {row["asset_id"]: int(row["total"] or 0) for row in held}
    fees = {row["asset_id"]: int(row["total"] or 0) for row in kept}
    ctx.stats["fee_assets"] = len(fees)
    for asset in sorted(balances.keys() | fees.keys()):
        balance, expected = balances.get(asset, 0), fees.get(asset, 0)
        if balance != expected:
            yield Discrepancy(
                kind="fee_account_mismatch",
                severity=Severity.CRITICAL,
                summary=f"the fees account holds {balance} {asset} but payments' fees less refunded fees are {expected} "
                f"(difference {balance - expected:+d})",
                details={"asset": asset, "balance": balance, "fees_less_refunded": expected, "difference": balance - expected},
                refs=(ObjectRef("wallets", "asset", asset),),
            )


def idempotency_stuck_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """In-flight idempotency records whose lease has expired (`idempotency_orphans_list`'s
    predicate, streamed): a request that crashed, not yet taken over by the orphan recovery."""
    stuck = IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, lease_expires_at__lte=ctx.now).order_by("lease_expires_at", "id")
    for record in stuck.iterator(chunk_size=ctx.chunk_size):
        assert record.lease_expires_at is not None
        stuck_for = (ctx.now - record.lease_expires_at).total_seconds()
        yield Discrepancy(
            kind="idempotency_stuck_in_flight",
            severity=Severity.WARNING,
            summary=f"key {record.key!r} of {record.principal_id} ({record.scope}) in flight, lease expired {stuck_for:.0f} s ago",
            details={"principal_id": record.principal_id, "key": record.key, "scope": record.scope, "effect": record.effect,
                     "fence": record.fence, "request_id": record.request_id, "method": record.method, "path": record.path,
                     "lease_expires_at": record.lease_expires_at.isoformat(), "stuck_seconds": stuck_for, "minted": record.minted,
                     "claimed": record.created.isoformat()},
            refs=(ObjectRef("idempotency", "idempotencyrecord", str(record.pk)),),
        )


def _outbox_live() -> QuerySet[OutboxEvent]:
    return OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True)


def _outbox_backlog(ctx: CheckContext) -> tuple[int, float]:
    """How many live events are unpublished, and the oldest one's age in seconds (read once a run)."""
    if ctx.outbox_backlog is None:
        backlog = _outbox_live().aggregate(count=Count("id"), oldest=Min("created"))
        oldest = backlog["oldest"]
        ctx.outbox_backlog = int(backlog["count"]), max((ctx.now - oldest).total_seconds(), 0.0) if oldest else 0.0
    return ctx.outbox_backlog


def outbox_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Outbox lag (the oldest live unpublished event older than the threshold: one finding
    with the backlog) and dead letters (one finding each)."""
    unpublished, lag = _outbox_backlog(ctx)
    ctx.stats.update(unpublished=unpublished, lag_seconds=lag)
    if unpublished and lag > ctx.outbox_lag_threshold_seconds:
        first = _outbox_live().order_by("created", "id").values_list("id", "topic", "attempts", "last_error").first()
        assert first is not None
        yield Discrepancy(
            kind="outbox_lag",
            severity=Severity.WARNING,
            summary=f"{unpublished} outbox event(s) unpublished, the oldest ({first[0]}) for {lag:.0f} s",
            details={"unpublished": unpublished, "lag_seconds": lag, "threshold_seconds": ctx.outbox_lag_threshold_seconds,
                     "oldest_event": first[0], "oldest_topic": first[1], "oldest_attempts": first[2], "oldest_last_error": first[3][:500]},
            refs=(ObjectRef("payments", "outboxevent", str(first[0])),),
        )
    dead = OutboxEvent.objects.filter(dead_at__isnull=False, published_at__isnull=True).order_by("dead_at", "id")
    for event in dead.only("id", "topic", "attempts", "last_error", "dead_at", "created").iterator(chunk_size=ctx.chunk_size):
        assert event.dead_at is not None
        yield Discrepancy(
            kind="outbox_dead_letter",
            severity=Severity.WARNING,
            summary=f"outbox event {event.id} ({event.topic}) dead after {event.attempts} attempts: {event.last_error[:120]}",
            details={"event": event.id, "topic": event.topic, "attempts": event.attempts, "last_error": event.last_error[:500],
                     "dead_at": event.dead_at.isoformat(), "created": event.created.isoformat()},
            refs=(ObjectRef("payments", "outboxevent", event.id),),
        )


def _counter_totals(counters: list[Counter]) -> int:
    """The sum of these counters' `_total` samples, across every process writing to
    PROMETHEUS_MULTIPROC_DIR when it is set, else this process's own."""
    names = {f"{family.name}_total" for c in counters for family in c.describe()}
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        metrics = list(registry.collect())
    else:
        metrics = [m for c in counters for m in c.collect()]
    return round(sum(s.value for m in metrics for s in m.samples if s.name in names))


def payments_run_metrics(*, ctx: CheckContext) -> dict[str, Any]:
    """What the dashboard charts across runs: the outbox backlog, the idempotency records by
    state, and the replay and conflict counters (Prometheus: host-wide, not per tenant)."""
    unpublished, lag = _outbox_backlog(ctx)
    states = dict(IdempotencyRecord.objects.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return {
        "outbox_unpublished": unpublished,
        "outbox_lag_seconds": lag,
        "outbox_dead_letters": OutboxEvent.objects.filter(dead_at__isnull=False, published_at__isnull=True).count(),
        "idempotency_in_flight": int(states.get(RecordState.IN_FLIGHT, 0)),
        "idempotency_completed": int(states.get(RecordState.COMPLETED, 0)),
        "idempotency_failed_retryable": int(states.get(RecordState.FAILED_RETRYABLE, 0)),
        "idempotency_stuck": IdempotencyRecord.objects.filter(state=RecordState.IN_FLIGHT, lease_expires_at__lte=ctx.now).count(),
        "process_idempotency_replays_total": _counter_totals([idempotency_metrics.IDEMPOTENCY_REPLAYS]),
        "process_idempotency_conflicts_total": _counter_totals(
            [idempotency_metrics.IDEMPOTENCY_INFLIGHT_CONFLICTS, idempotency_metrics.IDEMPOTENCY_FINGERPRINT_MISMATCHES]
        ),
    }


@dataclass(frozen=True)
class SettlementComparison:
    day: date
    gateway: str
    matched: int
    ours_total: int
    psp_total: int
    missing_at_psp: list[str] = field(default_factory=list)  # our top-up ids the PSP did not settle
    missing_here: list[str] = field(default_factory=list)  # PSP charge ids with no top-up of ours
    amount_mismatches: list[str] = field(default_factory=list)  # top-up ids whose amounts differ

    @property
    def balanced(self) -> bool:
        return not (self.missing_at_psp or self.missing_here or self.amount_mismatches)


# The PSP down, refusing or not set up: the day's compare is one warning, never the end of
# the run (the ledger checks around it still report).
PSP_UNREADABLE = (PspUnavailable, PspNotConfigured, GatewayError)


def topup_settlement_compare(*, day: date) -> SettlementComparison:
    """Our top-ups charged on `day` at the active gateway against its settlement report, matched on the PSP reference."""
    account = gateway_account_active()
    if account is None:
        raise PspNotConfigured("no active card gateway")
    report = gateway_build(account=account).settlement_report(day=day)
    ours = {line.psp_reference: line for line in topup_settlement_lines(day=day, gateway=account.gateway)}
    psp_charges = {line.psp_reference: line for line in report.lines if line.kind == "charge"}
    missing_at_psp = sorted(line.topup_id for ref, line in ours.items() if ref not in psp_charges)
    missing_here = sorted(ref for ref in psp_charges if ref not in ours)
    mismatches = sorted(line.topup_id for ref, line in ours.items() if ref in psp_charges and psp_charges[ref].amount != line.amount)
    return SettlementComparison(
        day=day, gateway=account.gateway, matched=len(set(ours) & set(psp_charges)),
        ours_total=sum(line.amount for line in ours.values()), psp_total=sum(line.amount for line in psp_charges.values()),
        missing_at_psp=missing_at_psp, missing_here=missing_here, amount_mismatches=mismatches,
    )


def psp_settlement_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """First, top-ups the PSP charged that ended with neither a credit nor a card refund a
    recovery window after they failed; then, for each of the last `settlement_days` UTC days,
    `topup_settlement_compare` (the PSP unreachable: one warning)."""
    yield from _charged_uncredited(ctx)
    if gateway_account_active() is None:
        ctx.stats["psp_settlement"] = "no active card gateway"
        return
    today = ctx.now.date()
    for day in (today - timedelta(days=back) for back in range(ctx.settlement_days - 1, -1, -1)):
        try:
            comparison = topup_settlement_compare(day=day)
        except PSP_UNREADABLE as error:
            yield Discrepancy(
                kind="psp_settlement_unavailable", severity=Severity.WARNING,
                summary=f"the PSP's settlement report for {day} could not be read: {error}", details={"day": day.isoformat()},
            )
            continue
        ctx.stats[f"psp_settlement_{day.isoformat()}"] = {"matched": comparison.matched, "ours": comparison.ours_total, "psp": comparison.psp_total}
        differences = (
            ("psp_settlement_missing_line", "topup", comparison.missing_at_psp,
             "top-up {} was credited as charged on {}, but the PSP's settlement report has no such charge"),
            ("psp_settlement_unknown_charge", "psp_reference", comparison.missing_here,
             "the PSP settled charge {} on {}, and no top-up of ours records it"),
            ("psp_settlement_amount_mismatch", "topup", comparison.amount_mismatches,
             "top-up {}: our amount and the PSP's settled amount for {} differ"),
        )
        yield from _settlement_differences(differences, day=day, gateway=comparison.gateway, model="topup")


def _charged_uncredited(ctx: CheckContext) -> Iterator[Discrepancy]:
    horizon = ctx.now - timedelta(seconds=ctx.topup_recovery_window_seconds)
    owed = topups_charged_uncredited().filter(updated__lt=horizon).order_by("created", "id")
    for topup in owed.iterator(chunk_size=ctx.chunk_size):
        yield Discrepancy(
            kind="psp_settlement_charged_uncredited", severity=Severity.CRITICAL,
            summary=f"top-up {topup.pk}: the PSP charged {topup.amount} {topup.asset_id} ({topup.psp_reference}), nothing was"
            f" credited ({topup.failure_code}) and no card refund is recorded",
            details={"topup": topup.pk, "customer": topup.customer_id, "asset": topup.asset_id, "amount": int(topup.amount),
                     "gateway": topup.gateway, "psp_reference": topup.psp_reference, "failure_code": topup.failure_code,
                     "charged_at": topup.psp_charged_at.isoformat() if topup.psp_charged_at else None,
                     "failed_at": topup.updated.isoformat(), "last_error": topup.last_error},
            refs=(ObjectRef("payments", "topup", topup.pk), ObjectRef("wallets", "customer", topup.customer_id)),
        )


@dataclass(frozen=True)
class PayoutComparison:
    day: date
    gateway: str
    matched: int
    missing_at_psp: list[str] = field(default_factory=list)  # our payouts (sent, not failed) the PSP does not hold
    unknown_at_psp: list[str] = field(default_factory=list)  # PSP payouts naming no payout of ours (their PSP references)
    amount_mismatches: list[str] = field(default_factory=list)  # our payout ids whose amounts differ
    returned_but_sent: list[str] = field(default_factory=list)  # our failed or canceled payouts the PSP holds as sent


def payout_settlement_compare(*, day: date) -> PayoutComparison:
    """Our payouts the PSP made on `day` against its settlement report's payout lines, matched on our payout id."""
    account = gateway_account_active()
    if account is None:
        raise PspNotConfigured("no active PSP gateway")
    report = gateway_build(account=account).settlement_report(day=day)
    lines = [line for line in report.lines if line.kind == "payout"]
    theirs = {line.reference: line for line in lines}
    ours = {line.payout_id: line for line in payout_settlement_lines(day=day, gateway=account.gateway)}
    # Named by a payout of ours not (yet) sent here: pending ones are the recovery's; failed or canceled ones gave the money back.
    elsewhere = dict(payout_statuses(payout_ids=[line.reference for line in lines if line.reference and line.reference not in ours]))
    return PayoutComparison(
        day=day, gateway=account.gateway, matched=len(set(ours) & set(theirs)),
        missing_at_psp=sorted(payout_id for payout_id in ours if payout_id not in theirs),
        unknown_at_psp=sorted(line.psp_reference for line in lines if line.reference not in ours and line.reference not in elsewhere),
        amount_mismatches=sorted(pid for pid, line in ours.items() if pid in theirs and abs(theirs[pid].amount) != line.amount),
        returned_but_sent=sorted(pid for pid, status in elsewhere.items() if status in ("failed", "canceled")),
    )


def payouts_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """The payouts-in-transit account holds exactly what unfinished payouts hold, per asset;
    payouts in transit a day past the PSP's promise; payouts waiting in the operator queue
    longer than `payout_review_warn_seconds`, or owing their money back (the PSP not
    answering) longer than `payout_return_warn_seconds`; then, at the active gateway, what
    the PSP holds on the way to merchants' bank accounts beyond what their unfinished payouts
    explain (`_destination_balances`), and for each of the last `settlement_days` UTC days,
    `payout_settlement_compare` (the PSP unreachable: one warning)."""
    owed = payouts_in_transit_totals()
    held = {line["asset"]: line["balance"] for line in account_balance_lines(account=system_account_get(role=SystemRole.PAYOUTS_IN_TRANSIT))}
    for asset in sorted(set(owed) | {code for code, amount in held.items() if amount}):
        if owed.get(asset, 0) != held.get(asset, 0):
            yield Discrepancy(
                kind="payouts_in_transit_mismatch", severity=Severity.CRITICAL,
                summary=f"the payouts-in-transit account holds {held.get(asset, 0)} {asset}, unfinished payouts {owed.get(asset, 0)}",
                details={"asset": asset, "account": held.get(asset, 0), "payouts": owed.get(asset, 0)},
            )
    for payout in payouts_in_transit_overdue(now=ctx.now - timedelta(days=1), limit=ctx.chunk_size):
        assert payout.arrival_expected_at is not None
        yield Discrepancy(
            kind="payout_overdue", severity=Severity.WARNING,
            summary=f"payout {payout.pk} in transit since {payout.psp_created_at or payout.created:%Y-%m-%d %H:%M}, promised by"
            f" {payout.arrival_expected_at:%Y-%m-%d %H:%M} UTC",
            details={"payout": payout.pk, "merchant": payout.merchant_id, "amount": payout.amount, "asset": payout.asset_id,
                     "psp_reference": payout.psp_reference, "arrival_expected_at": payout.arrival_expected_at.isoformat()},
            refs=(ObjectRef("payments", "payout", payout.pk),),
        )
    yield from _payouts_stuck(ctx)
    account = gateway_account_active()
    if account is None:
        return
    yield from _destination_balances(ctx, account=account)
    today = ctx.now.date()
    for day in (today - timedelta(days=back) for back in range(ctx.settlement_days - 1, -1, -1)):
        try:
            comparison = payout_settlement_compare(day=day)
        except PSP_UNREADABLE as error:
            yield Discrepancy(kind="payout_settlement_unavailable", severity=Severity.WARNING,
                              summary=f"the PSP's payouts for {day} could not be read: {error}", details={"day": day.isoformat()})
            continue
        ctx.stats[f"payouts_{day.isoformat()}"] = {"matched": comparison.matched}
        differences = (
            ("payout_missing_at_psp", "payout", comparison.missing_at_psp, "payout {} was sent on {}, but the PSP holds no such payout"),
            ("payout_unknown_at_psp", "psp_reference", comparison.unknown_at_psp, "the PSP made payout {} on {}, and no payout of ours is it"),
            ("payout_amount_mismatch", "payout", comparison.amount_mismatches, "payout {}: our amount and the PSP's on {} differ"),
            ("payout_returned_but_sent", "payout", comparison.returned_but_sent,
             "payout {} failed here (its money back with the merchant), but the PSP holds it as sent on {}"),
        )
        yield from _settlement_differences(differences, day=day, gateway=comparison.gateway, model="payout")


def _payouts_stuck(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Payouts a person (the operator queue) or the PSP (a return it does not answer about)
    has kept waiting too long: their money is neither with the merchant nor at the bank."""
    for payout in payouts_in_review_since(before=ctx.now - timedelta(seconds=ctx.payout_review_warn_seconds))[:ctx.chunk_size]:
        assert payout.review_at is not None
        yield Discrepancy(
            kind="payout_review_waiting", severity=Severity.WARNING,
            summary=f"payout {payout.pk} ({payout.status}) waits in the operator queue since {payout.review_at:%Y-%m-%d %H:%M} UTC:"
            f" {payout.review_reason}"[:500],
            details={"payout": payout.pk, "merchant": payout.merchant_id, "amount": payout.amount, "asset": payout.asset_id,
                     "status": payout.status, "review_at": payout.review_at.isoformat(), "proposed": payout.review_outcome},
            refs=(ObjectRef("payments", "payout", payout.pk),),
        )
    for payout in payouts_returns_owed_since(before=ctx.now - timedelta(seconds=ctx.payout_return_warn_seconds))[:ctx.chunk_size]:
        assert payout.return_owed_at is not None
        yield Discrepancy(
            kind="payout_return_overdue", severity=Severity.WARNING,
            summary=f"payout {payout.pk} owes its money back since {payout.return_owed_at:%Y-%m-%d %H:%M} UTC, and the PSP has not"
            f" given it back yet: {payout.last_error or 'no answer'}"[:500],
            details={"payout": payout.pk, "merchant": payout.merchant_id, "amount": payout.amount, "asset": payout.asset_id,
                     "status": payout.status, "return_owed_at": payout.return_owed_at.isoformat()},
            refs=(ObjectRef("payments", "payout", payout.pk),),
        )


# The stat in which a run keeps the last merchant whose balance at the PSP it read: the next run goes on after it.
DESTINATIONS_CURSOR = "payout_destinations_next"


def _destinations_cursor() -> str:
    """Where the last run that read merchants' balances at the PSP stopped ("": the start)."""
    last = (
        ReconciliationRun.objects.filter(report__checks__payouts__stats__has_key=DESTINATIONS_CURSOR)
        .order_by("-created", "-id").values_list("report", flat=True).first()
    )
    return str(last["checks"]["payouts"]["stats"][DESTINATIONS_CURSOR]) if last else ""


def _destination_balances(ctx: CheckContext, *, account: GatewayAccount) -> Iterator[Discrepancy]:
    """Where the PSP keeps a merchant's money on its way to the bank (at Stripe, the
    merchant's connected account, paid out manually by us alone) holds no more than the
    merchant's unfinished payouts explain: sent and not yet paid out, failed and owed back,
    or in the operator queue. More is a failed payout's money whose word never reached us (a
    lost `payout.failed`, even after paid) or an operator's resolution the PSP never
    followed: out of both the merchant's balance and ours (CRITICAL). Held only as much as
    payouts in transit may have brought back is a WARNING: one of them may have failed, its
    word on the way (the recovery asks the PSP about those past their promise). Every
    merchant with a bank account at the gateway is read in turn,
    `ctx.payout_destinations_per_run` a run, each run going on after the merchant the last
    one read (kept in its stats)."""
    destinations = payout_destinations_page(gateway=account.gateway, after=_destinations_cursor(), limit=ctx.payout_destinations_per_run)
    ctx.stats["payout_destinations_checked"] = len(destinations)
    ctx.stats[DESTINATIONS_CURSOR] = destinations[-1][0] if destinations else ""
    if not destinations:
        return
    try:
        gateway = gateway_build(account=account)
    except GatewayError as error:
        yield Discrepancy(kind="payout_destination_unavailable", severity=Severity.WARNING,
                          summary=f"the PSP's balances of merchants' bank accounts could not be read: {error}", details={})
        return
    explained = payouts_held_at_psp_explained(merchant_ids=[merchant for merchant, _ in destinations], gateway=account.gateway)
    for merchant_id, destination in destinations:
        try:
            held = {code: amount for code, amount in gateway.destination_balance(destination=destination).items() if amount}
        except GatewayError as error:
            yield Discrepancy(kind="payout_destination_unavailable", severity=Severity.WARNING,
                              summary=f"the PSP's balance for {merchant_id}'s bank account could not be read: {error}",
                              details={"merchant": merchant_id, "destination": destination}, refs=(ObjectRef("wallets", "merchant", merchant_id),))
            continue
        known = explained.get(merchant_id, HeldAtPspExplained(unsettled={}, in_transit={}))
        for code, amount in sorted(held.items()):
            unsettled, in_transit = known.unsettled.get(code, 0), known.in_transit.get(code, 0)
            if amount <= unsettled:
                continue
            details = {"merchant": merchant_id, "destination": destination, "asset": code, "amount": amount, "explained": unsettled,
                       "in_transit": in_transit, "gateway": account.gateway}
            if amount <= unsettled + in_transit:
                yield Discrepancy(
                    kind="payout_destination_held_in_transit", severity=Severity.WARNING,
                    summary=f"the PSP holds {amount} {code} on the way to {merchant_id}'s bank account ({destination}), more than its"
                    f" unfinished payouts explain ({unsettled}) unless a payout in transit ({in_transit}) failed and its word has not"
                    " reached us yet", details=details, refs=(ObjectRef("wallets", "merchant", merchant_id),),
                )
                continue
            yield Discrepancy(
                kind="payout_destination_not_empty", severity=Severity.CRITICAL,
                summary=f"the PSP holds {amount} {code} on the way to {merchant_id}'s bank account ({destination}), more than its"
                f" unfinished payouts explain ({unsettled}, and {in_transit} in transit): a failed payout's money the PSP never gave"
                " back, or whose failure never reached us", details=details, refs=(ObjectRef("wallets", "merchant", merchant_id),),
            )


def _settlement_differences(
    differences: tuple[tuple[str, str, Iterable[str], str], ...], *, day: date, gateway: str, model: str
) -> Iterator[Discrepancy]:
    """One CRITICAL discrepancy per value of each (kind, key, values, summary) of a day's
    compare with the PSP; a value keyed by `model` links to that object of ours."""
    for kind, key, values, summary in differences:
        for value in values:
            yield Discrepancy(
                kind=kind, severity=Severity.CRITICAL, summary=summary.format(value, day),
                details={"day": day.isoformat(), key: value, "gateway": gateway},
                refs=(ObjectRef("payments", model, value),) if key == model else (),
            )
