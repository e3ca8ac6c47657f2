"""Reads for the back office's books (current tenant): the trial balance at an instant and
the month-end report per asset. Balances come from wallets.books.

The month-end report is for "the tenant as a whole": its participants, every customer's
wallet and every merchant's account together. Money moves between participants (payments,
transfers, refunds) without changing their total; it changes only when a ledger
transaction has a leg on a system account (PSP funding, fees, bonus pool, adjustments,
carbon registry, payouts in transit). Every transaction sums to zero per asset, so the
participants' total moves by minus the sum of those system legs: a system leg that is
debited brings money in (an inflow), one that is credited takes it out (an outflow).
Only transactions that also have a participant's leg in the asset count: one between
system accounts alone (a payout paid: in transit to the PSP) moves nothing of the
participants' and would otherwise show as an inflow and an outflow of the same money.
Hence opening + inflows - outflows = closing, exactly, grouped by the transaction's kind
and the system account on the other side. The opening and closing are the participants'
total before the month's first and after its last instant, read as minus the system
accounts' balances (a handful of accounts, not every wallet).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from django.db.models import BigIntegerField, Case, Exists, OuterRef, Sum, Value, When
from django.db.models.functions import Abs

from tenants.selectors import tenant_zone
from wallets.books import TrialBalanceLine, account_balance_before, month_bounds, trial_balance_at
from wallets.models import Account, AccountKind, Asset, LedgerEntry, SystemRole

TRIAL_BALANCE_TOP = 50  # participant accounts shown per asset on the page; the CSV has them all


@dataclass
class AssetTrial:
    """One asset's side of the trial balance: every account counted, the sum (zero when the
    books balance), the system accounts by name and the largest participant balances."""

    asset: str
    accounts: int = 0
    total: int = 0
    debits: int = 0  # the negative balances' sum (system accounts mostly)
    credits: int = 0
    system: list[tuple[str, str, int]] = field(default_factory=list)  # (role, label, balance)
    top: list[TrialBalanceLine] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        return self.total == 0


def trial_balance_summary(*, at: datetime, top: int = TRIAL_BALANCE_TOP) -> list[AssetTrial]:
    """The trial balance at `at` per asset, for the page: totals, every system account
    (named, zero when it holds nothing), the `top` participants by absolute balance."""
    labels = dict(SystemRole.choices)
    by_asset: dict[str, AssetTrial] = {}
    participants: dict[str, list[TrialBalanceLine]] = {}
    system: dict[str, dict[str, int]] = {}
    for line in trial_balance_at(at=at):
        trial = by_asset.setdefault(line.asset, AssetTrial(asset=line.asset))
        trial.accounts += 1
        trial.total += line.balance
        if line.balance < 0:
            trial.debits += line.balance
        else:
            trial.credits += line.balance
        if line.system_role:
            system.setdefault(line.asset, {})[line.system_role] = line.balance
        else:
            participants.setdefault(line.asset, []).append(line)
    for asset, trial in by_asset.items():
        held = system.get(asset, {})
        trial.system = [(role, labels[role], held.get(role, 0)) for role in SystemRole.values]
        trial.top = sorted(participants.get(asset, []), key=lambda line: (-abs(line.balance), line.account))[:top]
    return [by_asset[asset] for asset in sorted(by_asset)]


TRIAL_BALANCE_CSV_HEADER = ["asset", "account", "kind", "party", "system_account", "balance"]


def trial_balance_csv_rows(*, at: datetime) -> Iterator[list[Any]]:
    """Every account's non-zero balance per asset at `at` (minor units), then a total row per
    asset (zero when the books balance)."""
    labels = dict(SystemRole.choices)
    yield ["trial balance at", at.isoformat()]
    yield TRIAL_BALANCE_CSV_HEADER
    totals: dict[str, int] = {}
    for line in trial_balance_at(at=at):
        totals[line.asset] = totals.get(line.asset, 0) + line.balance
        yield [line.asset, line.account, line.kind, line.party or "", labels.get(line.system_role or "", ""), line.balance]
    for asset in sorted(totals):
        yield [asset, "TOTAL", "", "", "", totals[asset]]


@dataclass(frozen=True)
class Flow:
    kind: str  # the ledger transaction's kind
    counterparty: str  # the system account on the other side
    amount: int  # > 0


@dataclass(frozen=True)
class MonthEndReport:
    asset: str
    month: date
    start: datetime
    end: datetime
    opening: int
    inflows: list[Flow]
    outflows: list[Flow]
    closing: int

    @property
    def inflow_total(self) -> int:
        return sum(flow.amount for flow in self.inflows)

    @property
    def outflow_total(self) -> int:
        return sum(flow.amount for flow in self.outflows)


def participants_total_before(*, asset_code: str, instant: datetime, system_accounts: dict[str, str]) -> int:
    """What every customer and merchant holds together in `asset_code` before `instant`:
    minus the system accounts' balances, since the ledger sums to zero per asset."""
    return -sum(account_balance_before(account_id=account_id, asset_code=asset_code, instant=instant) for account_id in system_accounts)


def month_end_report(*, asset_code: str, month: date) -> MonthEndReport:
    """The tenant's participants' opening, inflows and outflows by kind, and closing in
    `asset_code` over the calendar month holding `month` in the tenant's time zone (module
    docstring). The month's closing is the next month's opening."""
    start, end = month_bounds(month=month, zone=tenant_zone())
    system_accounts = {pk: str(role) for pk, role in Account.objects.filter(kind=AccountKind.SYSTEM).values_list("id", "system_role")}
    labels = dict(SystemRole.choices)
    participant_leg = LedgerEntry.objects.filter(transaction_id=OuterRef("transaction_id"), asset_id=asset_code).exclude(
        account_id__in=list(system_accounts))
    legs = (
        LedgerEntry.objects.filter(account_id__in=list(system_accounts), asset_id=asset_code, created__gte=start, created__lt=end)
        .filter(Exists(participant_leg))
        .values("transaction__kind", "account_id").order_by()
        .annotate(
            inflow=Sum(Case(When(amount__lt=0, then=Abs("amount")), default=Value(0), output_field=BigIntegerField())),
            outflow=Sum(Case(When(amount__gt=0, then="amount"), default=Value(0), output_field=BigIntegerField())),
        )
    )
    inflows: list[Flow] = []
    outflows: list[Flow] = []
    for row in legs:
        counterparty = labels[system_accounts[row["account_id"]]]
        if row["inflow"]:
            inflows.append(Flow(kind=row["transaction__kind"], counterparty=counterparty, amount=int(row["inflow"])))
        if row["outflow"]:
            outflows.append(Flow(kind=row["transaction__kind"], counterparty=counterparty, amount=int(row["outflow"])))
    order = lambda flow: (flow.kind, flow.counterparty)  # noqa: E731
    return MonthEndReport(
        asset=asset_code, month=month.replace(day=1), start=start, end=end,
        opening=participants_total_before(asset_code=asset_code, instant=start, system_accounts=system_accounts),
        inflows=sorted(inflows, key=order), outflows=sorted(outflows, key=order),
        closing=participants_total_before(asset_code=asset_code, instant=end, system_accounts=system_accounts),
    )


def month_end_csv_rows(*, report: MonthEndReport) -> Iterator[list[Any]]:
    zone = tenant_zone()
    yield ["month-end report", report.month.strftime("%Y-%m"), "asset", report.asset, "time zone", zone.key]
    yield ["from", report.start.astimezone(zone).isoformat(), "to", report.end.astimezone(zone).isoformat()]
    yield ["line", "kind", "counterparty", "amount"]
    yield ["opening", "", "", report.opening]
    for flow in report.inflows:
        yield ["inflow", flow.kind, flow.counterparty, flow.amount]
    for flow in report.outflows:
        yield ["outflow", flow.kind, flow.counterparty, -flow.amount]
    yield ["closing", "", "", report.closing]


def assets_known() -> list[Asset]:
    return list(Asset.objects.order_by("-is_main", "code"))

