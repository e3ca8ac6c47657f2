"""The books: balances as of an instant, from the ledger, and the calendar of a tenant's
months. Reads only.

Instants: `account_balance_before(instant)` sums the entries created strictly before it, so
a period [from, to) opens at the balance before `from` and closes at the balance before
`to`, and one month's closing is the next month's opening exactly. `at` (what `?at=`
answers) includes the entries created at that instant: PostgreSQL stamps microseconds, so
"at or before `at`" is "before `at` + 1 µs".

Speed: an account's balance before an instant is the sum of its daily totals
(wallets.daily_totals) for the UTC days before the instant's day, plus its entries from that
day's midnight up to the instant (index ledgerentry_account_created): a year of history is a
few hundred summary rows and at most one day of entries, never the whole history. Each kind
of account reads so once its daily totals' staged migration switched reads; before, the
same answer comes from the ledger alone. Both parts are read in ONE statement, one snapshot:
a posting committing in between cannot be counted in one part and missed in the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import Sum

from wallets.daily_totals import daily_totals_read
from wallets.models import Account, AccountKind, Balance, LedgerEntry

MICROSECOND = timedelta(microseconds=1)


# The summary's days before the instant's UTC day, then that day's entries up to the instant.
_BEFORE_SQL = """
SELECT asset_id, SUM(amount) FROM (
    SELECT asset_id, credited - debited AS amount FROM wallets_merchantdailytotal
     WHERE account_id = %(account)s AND day < %(day)s {asset}
    UNION ALL
    SELECT asset_id, amount FROM wallets_ledgerentry
     WHERE account_id = %(account)s AND created >= %(midnight)s AND created < %(instant)s {asset}
) parts GROUP BY asset_id ORDER BY asset_id
"""


def _account_kind(account_id: str) -> str | None:
    return Account.objects.filter(pk=account_id).values_list("kind", flat=True).first()


def _balances_before(*, account_id: str, instant: datetime, asset_code: str | None) -> dict[str, int]:
    """Per asset (or the one asset), the entries created before `instant`, the ones at zero included."""
    kind = _account_kind(account_id)
    if kind is None or not daily_totals_read(kind=kind):
        entries = LedgerEntry.objects.filter(account_id=account_id, created__lt=instant)
        if asset_code is not None:
            entries = entries.filter(asset_id=asset_code)
        rows = entries.values("asset_id").annotate(total=Sum("amount")).order_by("asset_id")
        return {row["asset_id"]: int(row["total"]) for row in rows}
    midnight = datetime.combine(instant.astimezone(UTC).date(), time.min, tzinfo=UTC)
    params: dict[str, Any] = {"account": account_id, "day": midnight.date(), "midnight": midnight, "instant": instant, "code": asset_code}
    with connection.cursor() as cursor:
        cursor.execute(_BEFORE_SQL.format(asset="AND asset_id = %(code)s" if asset_code is not None else ""), params)
        return {str(asset): int(total) for asset, total in cursor.fetchall()}


def account_balance_before(*, account_id: str, asset_code: str, instant: datetime) -> int:
    """The account's balance in one asset from the entries created before `instant`."""
    return _balances_before(account_id=account_id, instant=instant, asset_code=asset_code).get(asset_code, 0)


def account_balances_at(*, account_id: str, at: datetime) -> dict[str, int]:
    """The account's balance per asset as of `at`, the entries created at `at` included;
    assets the account never held are absent."""
    return _balances_before(account_id=account_id, instant=at + MICROSECOND, asset_code=None)


def account_balance_lines_at(*, account_id: str, at: datetime) -> list[dict[str, int | str]]:
    """The account's balance as of `at` in every asset it holds now or held then, by asset
    (what `?at=` answers): an asset it had not yet held at `at`, or an instant before the
    account existed, answers 0."""
    then = account_balances_at(account_id=account_id, at=at)
    held = set(Balance.objects.filter(account_id=account_id).values_list("asset_id", flat=True).distinct())
    return [{"asset": asset, "balance": then.get(asset, 0)} for asset in sorted(held | then.keys())]


@dataclass(frozen=True)
class TrialBalanceLine:
    account: str
    kind: str  # customer, merchant or system
    party: str | None  # the customer's or merchant's id
    system_role: str | None
    asset: str
    balance: int


# Every account: the summary's days before the instant's UTC day, that day's entries up to it
# (found through ledgerentry_created_brin), the accounts joined in the same statement.
_TRIAL_SQL = """
SELECT a.id, a.kind, COALESCE(a.customer_id, a.merchant_id), a.system_role, parts.asset_id, SUM(parts.amount)
  FROM (
    SELECT account_id, asset_id, credited - debited AS amount FROM wallets_merchantdailytotal WHERE day < %(day)s
    UNION ALL
    SELECT account_id, asset_id, amount FROM wallets_ledgerentry WHERE created >= %(midnight)s AND created < %(instant)s
  ) parts JOIN wallets_account a ON a.id = parts.account_id
 GROUP BY a.id, parts.asset_id HAVING SUM(parts.amount) <> 0
"""
_TRIAL_LEDGER_SQL = """
SELECT a.id, a.kind, COALESCE(a.customer_id, a.merchant_id), a.system_role, e.asset_id, SUM(e.amount)
  FROM wallets_ledgerentry e JOIN wallets_account a ON a.id = e.account_id
 WHERE e.created < %(instant)s
 GROUP BY a.id, e.asset_id HAVING SUM(e.amount) <> 0
"""


def trial_balance_at(*, at: datetime) -> list[TrialBalanceLine]:
    """Every account's non-zero balance per asset as of `at` (entries created at `at`
    included), by asset then account; an account at zero in an asset has no line. Per
    asset the balances sum to zero: every ledger transaction does, and one statement reads
    them all in one snapshot. From the daily totals once both kinds' (merchants', and every
    other account's) switched reads, else from the ledger alone."""
    instant = at + MICROSECOND
    midnight = datetime.combine(instant.astimezone(UTC).date(), time.min, tzinfo=UTC)
    summary = daily_totals_read(kind=AccountKind.MERCHANT) and daily_totals_read(kind=AccountKind.CUSTOMER)
    with connection.cursor() as cursor:
        cursor.execute(_TRIAL_SQL if summary else _TRIAL_LEDGER_SQL, {"day": midnight.date(), "midnight": midnight, "instant": instant})
        lines = [
            TrialBalanceLine(account=str(account), kind=str(kind), party=party, system_role=role, asset=str(asset), balance=int(total))
            for account, kind, party, role, asset, total in cursor.fetchall()
        ]
    return sorted(lines, key=lambda line: (line.asset, line.account))  # Python's order, not the database collation's


def month_bounds(*, month: date, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The instants [start, end) of the calendar month holding `month` in `zone`: local
    midnight of its first day to local midnight of the next month's first day (a day of 23
    or 25 hours where daylight saving changes inside it), in UTC: Python subtracts and
    compares two datetimes of one tzinfo by their wall clocks, which a DST change breaks."""
    first = month.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return (datetime(first.year, first.month, 1, tzinfo=zone).astimezone(UTC),
            datetime(following.year, following.month, 1, tzinfo=zone).astimezone(UTC))
