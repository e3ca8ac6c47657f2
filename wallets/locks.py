"""Every row lock the ledger takes, and the one order it takes them in.

Deadlock freedom depends on every writer using these helpers, never an inline
`select_for_update()`. The global order:
  1. business rows (payment, intent, top-up, token: payments/locks.py) before any balance;
  2. balance rows by `lock_key`: customer accounts, then merchant accounts, then system
     accounts; customers and merchants by account id, system accounts by role (PSP
     funding, adjustments, fees, bonus pool, carbon registry); within an account the
     non-reward assets before the reward assets (CARBON, POINT), each group by code;
     shards ascending. All the balance rows one movement needs are locked by ONE
     statement, `balance_rows_lock`, which returns them in that order;
  3. an account row (freezes) and a hold row are locked on their own, never while
     holding balance rows of another account.

Merchant and system accounts are credited on one shard (the connection's own, so
concurrent payments to one merchant rarely meet); a merchant debit locks all its shards
of the asset.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection
from django.db.models import Case, IntegerField, Q, Value, When

from wallets.models import (
    BALANCE_SHARDS,
    CARBON_ASSET,
    POINTS_ASSET,
    Account,
    AccountKind,
    Balance,
    Hold,
    SystemRole,
)

REWARD_ASSETS = frozenset({POINTS_ASSET, CARBON_ASSET})
_KIND_RANK = {AccountKind.CUSTOMER: 0, AccountKind.MERCHANT: 1, AccountKind.SYSTEM: 2}
_SYSTEM_ROLE_RANK = {
    role: rank
    for rank, role in enumerate(
        [SystemRole.PSP_FUNDING, SystemRole.ADJUSTMENTS, SystemRole.FEES, SystemRole.BONUS_POOL, SystemRole.CARBON_REGISTRY]
    )
}
ALL_SHARDS = -1


def lock_key(*, account: Account, asset_code: str) -> tuple[int, str, int, str]:
    """Position of (account, asset) in the global lock order (see the module docstring)."""
    owner = account.id
    if account.kind == AccountKind.SYSTEM and account.system_role:
        owner = f"{_SYSTEM_ROLE_RANK[SystemRole(account.system_role)]:02d}"
    return (_KIND_RANK[AccountKind(account.kind)], owner, 1 if asset_code in REWARD_ASSETS else 0, asset_code)


def connection_shard() -> int:
    """The shard this connection credits: its backend pid modulo the shard count, so that
    with no more connections than shards, payments to one merchant rarely wait."""
    pid = connection.connection.info.backend_pid if connection.connection is not None else 0
    return int(pid) % BALANCE_SHARDS


@dataclass(frozen=True)
class BalanceWant:
    """A balance row a movement will touch: `shard` is ALL_SHARDS for a merchant debit.
    `creatable` rows are made empty if missing (credits, system accounts); a missing
    customer row that is debited means an empty wallet, and is refused, not made."""

    account: Account
    asset_code: str
    shard: int
    creatable: bool = True


def balance_want(*, account: Account, asset_code: str, amount: int) -> BalanceWant:
    """Which row(s) a net change of `amount` on (account, asset) touches: a customer's single
    row; every shard for a merchant debit; else the connection's shard."""
    if account.kind == AccountKind.CUSTOMER:
        return BalanceWant(account, asset_code, 0, creatable=amount > 0)
    if account.kind == AccountKind.MERCHANT and amount < 0:
        return BalanceWant(account, asset_code, ALL_SHARDS, creatable=False)
    return BalanceWant(account, asset_code, connection_shard())


class LockedBalances:
    """Balance rows locked FOR UPDATE in this transaction, keyed (account id, asset, shard)."""

    def __init__(self, rows: Iterable[Balance]) -> None:
        self.rows: dict[tuple[str, str, int], Balance] = {(r.account_id, r.asset_id, r.shard): r for r in rows}

    def row(self, *, account: Account, asset_code: str, shard: int = 0) -> Balance | None:
        return self.rows.get((account.id, asset_code, shard))

    def shards(self, *, account: Account, asset_code: str) -> list[Balance]:
        return sorted((r for (acc, code, _), r in self.rows.items() if acc == account.id and code == asset_code), key=lambda r: r.shard)

    def covers(self, want: BalanceWant) -> bool:
        if want.shard == ALL_SHARDS:
            return True  # missing shards hold nothing
        return (want.account.id, want.asset_code, want.shard) in self.rows


def balance_rows_lock(*, wants: Iterable[BalanceWant]) -> LockedBalances:
    """Lock every balance row of `wants` FOR UPDATE with ONE statement, in the global lock
    order (ORDER BY the order below; PostgreSQL locks rows as the sort emits them).

    Creatable rows that do not exist yet (a wallet's first POINT credit, a shard's first
    payment) are inserted empty first, then the statement runs again: only the first
    movement on a row pays for that. When a row that must exist is missing (a debit of an
    empty wallet, perhaps in an asset the tenant does not have) nothing is inserted: the
    caller refuses. The asset comes with each row (its cap). Merchant-debit wants lock the
    shards that exist (a missing shard holds nothing).
    """
    ordered = sorted(set(wants), key=lambda w: (lock_key(account=w.account, asset_code=w.asset_code), w.shard))
    if not ordered:
        return LockedBalances([])
    locked = _select_for_update(ordered)
    missing = [w for w in ordered if not locked.covers(w)]
    if missing and all(w.creatable for w in missing):
        Balance.objects.bulk_create(
            [
                Balance(account_id=w.account.id, asset_id=w.asset_code, shard=w.shard, may_go_negative=w.account.kind == AccountKind.SYSTEM)
                for w in missing
            ],
            ignore_conflicts=True,
        )
        locked = _select_for_update(ordered)
    return locked


def _select_for_update(ordered: list[BalanceWant]) -> LockedBalances:
    matches = Q()
    rank: list[When] = []
    for position, want in enumerate(ordered):
        match = Q(account_id=want.account.id, asset_id=want.asset_code)
        if want.shard != ALL_SHARDS:
            match &= Q(shard=want.shard)
        matches |= match
        rank.append(When(match, then=Value(position)))
    rows = (
        Balance.objects.filter(matches)
        .select_related("asset")
        .annotate(lock_rank=Case(*rank, output_field=IntegerField()))
        .order_by("lock_rank", "shard")
        .select_for_update(of=("self",))
    )
    return LockedBalances(rows)


def account_lock(*, account_id: str) -> Account:
    """Lock one account row (freezes). Takes no balance row."""
    return Account.objects.filter(pk=account_id).order_by("pk").select_for_update().get()


def hold_lock(*, hold_id: str) -> Hold:
    """Lock one hold row; callers lock its balance row after it."""
    return Hold.objects.filter(pk=hold_id).order_by("pk").select_for_update().get()
