"""The books: balances as of an instant, from the ledger, and the calendar of a tenant's
months. Reads only.

Instants: `account_balance_before(instant)` sums the entries created strictly before it, so
a period [from, to) opens at the balance before `from` and closes at the balance before
`to`, and one month's closing is the next month's opening exactly. `at` (what `?at=`
answers) includes the entries created at that instant: PostgreSQL stamps microseconds, so
"at or before `at`" is "before `at` + 1 µs".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from django.db.models import Sum

from wallets.models import Account, LedgerEntry

MICROSECOND = timedelta(microseconds=1)


def account_balance_before(*, account_id: str, asset_code: str, instant: datetime) -> int:
    """The account's balance in one asset from the entries created before `instant`."""
    total = LedgerEntry.objects.filter(account_id=account_id, asset_id=asset_code, created__lt=instant).aggregate(total=Sum("amount"))
    return int(total["total"] or 0)


def account_balances_at(*, account_id: str, at: datetime) -> dict[str, int]:
    """The account's balance per asset as of `at`, the entries created at `at` included;
    assets the account never held are absent."""
    rows = (LedgerEntry.objects.filter(account_id=account_id, created__lt=at + MICROSECOND)
            .values("asset_id").annotate(total=Sum("amount")).order_by("asset_id"))
    return {row["asset_id"]: int(row["total"]) for row in rows}


@dataclass(frozen=True)
class TrialBalanceLine:
    account: str
    kind: str  # customer, merchant or system
    party: str | None  # the customer's or merchant's id
    system_role: str | None
    asset: str
    balance: int


def trial_balance_at(*, at: datetime) -> list[TrialBalanceLine]:
    """Every account's non-zero balance per asset as of `at` (entries created at `at`
    included), by asset then account. Per asset the balances sum to zero: every ledger
    transaction does."""
    totals = (LedgerEntry.objects.filter(created__lt=at + MICROSECOND)
              .values("account_id", "asset_id").annotate(total=Sum("amount")).exclude(total=0))
    accounts = {a.pk: a for a in Account.objects.filter(pk__in={row["account_id"] for row in totals})}
    lines = [
        TrialBalanceLine(
            account=row["account_id"], kind=accounts[row["account_id"]].kind,
            party=accounts[row["account_id"]].customer_id or accounts[row["account_id"]].merchant_id,
            system_role=accounts[row["account_id"]].system_role, asset=row["asset_id"], balance=int(row["total"]),
        )
        for row in totals
    ]
    return sorted(lines, key=lambda line: (line.asset, line.account))


def month_bounds(*, month: date, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The instants [start, end) of the calendar month holding `month` in `zone`: local
    midnight of its first day to local midnight of the next month's first day (a day of 23
    or 25 hours where daylight saving changes inside it), in UTC: Python subtracts and
    compares two datetimes of one tzinfo by their wall clocks, which a DST change breaks."""
    first = month.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return (datetime(first.year, first.month, 1, tzinfo=zone).astimezone(UTC),
            datetime(following.year, following.month, 1, tzinfo=zone).astimezone(UTC))
