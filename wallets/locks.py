"""Every row lock the ledger takes, and the one order it takes them in.

Deadlock freedom depends on every writer using these helpers, never an inline
`select_for_update()`. The global order:
  1. business rows (payment, intent, top-up, token, mandate: payments/locks.py) before any
     balance; a fenced completion (a card top-up) locks its idempotency record before them
     (payments/idempotency/locks.py);
  2. balance rows, all of them in ONE statement per transaction (`balance_rows_lock`, or
     `balance_rows_lock_by_owner` when the accounts are not loaded yet), ordered by
     (account id, asset, shard) (`LOCK_ORDER`): PostgreSQL locks the rows as the sort
     emits them, so any two transactions meet their common rows in the same order. No
     transaction locks balance rows a second time while it holds them (an intent capture
     consumes its hold inside the charge's posting for that reason); a payment that
     locked in a savepoint and rolled it back (a reward cap reached meanwhile) holds
     none of them any more when it locks again;
  3. a freeze locks all the account's balance rows (one ordered statement), then the
     account row; nothing locks an account row before balance rows;
  4. after its balance rows, a posting takes the merchant daily-total rows of its
     merchant legs (wallets.daily_totals), in key order; such a row is only taken while
     holding the merchant's balance row of the same shard (or every shard), so it adds no
     wait of its own. The daily-totals backfill takes every balance row of a batch of
     merchants in one ordered statement (as a merchant debit does), then their totals.
Customer rows are business rows taken by contact updates (one) and the contact backfill
(a batch, in id order); no posting takes them. A staff member's row comes before all of
these: an adjustment request takes its maker's row (`staff_member_lock`) to count that
member's adjustments one request at a time, then posts.

Other apps name the locks they take in their own `locks.py`, each helper saying where it
sits: rows no posting takes are locked by transactions that take no money lock at all
(gateway accounts and PSP event markers: payments/locks.py; a tenant's row:
payments/idempotency/locks.py; outbox rows, webhook deliveries and endpoints, and a
merchant's row while an endpoint is registered: webhooks/locks.py; a reconciliation run's
row: reconciliation/locks.py).

Merchant and system accounts are credited on one shard (the connection's own, so
concurrent payments to one merchant rarely meet); a merchant debit locks all its shards
of the asset.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet

from fastpath.compiled import CompiledQuery, CompiledShapes, Param
from wallets.models import BALANCE_SHARDS, Account, AccountKind, Balance, Customer, Hold, StaffMember, StagedMigrationState

ALL_SHARDS = -1


# The global order of balance rows (module docstring), as the locking SELECT's ORDER BY.
LOCK_ORDER = ("account_id", "asset_id", "shard")


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

    def account_of(self, *, kind: AccountKind, owner: str) -> Account | None:
        """The account of a customer id, merchant id or system role among the locked rows."""
        for row in self.rows.values():
            account = row.account
            if account.kind == kind and owner in (account.customer_id, account.merchant_id, account.system_role):
                return account
        return None

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
    ordered = list(dict.fromkeys(wants))
    if not ordered:
        return LockedBalances([])
    locked = _select_for_update(ordered)
    missing = [w for w in ordered if not locked.covers(w)]
    if missing and all(w.creatable for w in missing):
        Balance.objects.bulk_create(
            [
                Balance(
                    account_id=w.account.id, asset_id=w.asset_code, shard=w.shard,
                    may_go_negative=w.account.kind == AccountKind.SYSTEM, frozen=w.account.frozen,
                )
                for w in missing
            ],
            ignore_conflicts=True,
        )
        locked = _select_for_update(ordered)
    return locked


def _select_for_update(ordered: list[BalanceWant]) -> LockedBalances:
    # One condition per (account, shard), its assets as a list: fewer ORM lookups to build.
    groups: dict[tuple[str, int], list[str]] = {}
    for want in ordered:
        groups.setdefault((want.account.id, want.shard), []).append(want.asset_code)
    shape = tuple((shard == ALL_SHARDS, tuple(assets)) for (_, shard), assets in groups.items())
    values: dict[str, object] = {}
    for index, (account_id, shard) in enumerate(groups):
        values[f"account{index}"] = account_id
        if shard != ALL_SHARDS:
            values[f"shard{index}"] = shard
    return LockedBalances(_BY_ACCOUNT.get(shape).select(**values))


def _by_account_statement(shape: tuple[tuple[bool, tuple[str, ...]], ...]) -> CompiledQuery[Balance]:
    """The locking select of `balance_rows_lock` for one shape: per (account, shard) group,
    whether it takes every shard, and its asset codes (constants: a handful per tenant)."""
    matches = Q()
    for index, (all_shards, assets) in enumerate(shape):
        if all_shards:
            matches |= Q(account_id=Param(f"account{index}"), asset_id__in=assets)
        else:
            matches |= Q(account_id=Param(f"account{index}"), shard=Param(f"shard{index}"), asset_id__in=assets)
    return CompiledQuery(_locking_select(matches), prepared=True)


def _locking_select(matches: Q) -> QuerySet[Balance]:
    """SELECT .. FOR UPDATE OF wallets_balance ORDER BY the lock order, with each row's
    account (frozen flag) and asset (cap)."""
    return _ordered_select(matches).select_for_update(of=("self",))


# Columns of the joined rows no movement reads once its balance rows are locked: leaving
# them out spares parsing two timestamps per row on every payment (about 1% of its
# instructions). Reading one would cost a
# statement per row; tests/test_ledger.py checks that no movement does.
UNREAD_JOINED_COLUMNS = ("account__created", "asset__created")


def _ordered_select(matches: Q) -> QuerySet[Balance]:
    return Balance.objects.filter(matches).select_related("account", "asset").defer(*UNREAD_JOINED_COLUMNS).order_by(*LOCK_ORDER)


_OWNER_FIELD = {
    AccountKind.CUSTOMER: "account__customer_id", AccountKind.MERCHANT: "account__merchant_id", AccountKind.SYSTEM: "account__system_role",
}


@dataclass(frozen=True)
class OwnerRow:
    """A balance row named by its owner, for locking before the accounts are loaded:
    `owner` is a customer id, a merchant id, or a system role."""

    kind: AccountKind
    owner: str
    asset_code: str
    shard: int = 0


def balance_rows_lock_by_owner(*, rows: Iterable[OwnerRow]) -> LockedBalances:
    """Lock the named balance rows FOR UPDATE with ONE statement in the global lock order,
    finding the accounts by their owners in the same statement (the payment path: its
    accounts and its rows in one round trip). Rows that do not exist are simply absent:
    the caller then loads the accounts and uses `balance_rows_lock`, which makes them."""
    return _by_owner(rows=rows, lock=True)


def balance_rows_read_by_owner(*, rows: Iterable[OwnerRow]) -> LockedBalances:
    """The rows `balance_rows_lock_by_owner` would lock, with their accounts and assets,
    read WITHOUT locking: a plan to check again once locked (the payment path reads its
    accounts here, writes its ledger rows, then locks the balance rows by account)."""
    return _by_owner(rows=rows, lock=False)


def _by_owner(*, rows: Iterable[OwnerRow], lock: bool) -> LockedBalances:
    groups: dict[tuple[AccountKind, str, int], list[str]] = {}
    for row in rows:
        groups.setdefault((row.kind, row.owner, row.shard), []).append(row.asset_code)
    if not groups:
        return LockedBalances([])
    shape = (lock, *((kind, tuple(assets)) for (kind, _, _), assets in groups.items()))
    values: dict[str, object] = {}
    for index, (_, owner, shard) in enumerate(groups):
        values[f"owner{index}"] = owner
        values[f"shard{index}"] = shard
    return LockedBalances(_BY_OWNER.get(shape).select(**values))


def _by_owner_statement(shape: tuple[Any, ...]) -> CompiledQuery[Balance]:
    """The select of `_by_owner` for one shape: whether it locks, then per group the
    owner's kind and the asset codes (constants: a handful per tenant)."""
    lock, *groups = shape
    matches = Q()
    for index, (kind, assets) in enumerate(groups):
        matches |= Q(**{_OWNER_FIELD[kind]: Param(f"owner{index}")}, shard=Param(f"shard{index}"), asset_id__in=assets)
    return CompiledQuery(_locking_select(matches) if lock else _ordered_select(matches), prepared=True)


# Compiled once per shape and process (fastpath.compiled): compiling these selects cost more
# Python than the rest of a payment. Prepared: planning the three-table join was the
# largest part of PostgreSQL's work for a payment.
_BY_ACCOUNT: CompiledShapes[Balance] = CompiledShapes(_by_account_statement)
_BY_OWNER: CompiledShapes[Balance] = CompiledShapes(_by_owner_statement)


def account_balance_rows_lock(*, account_id: str) -> list[Balance]:
    """Lock every balance row of one account, in the global order, with one statement (a
    freeze: it marks them)."""
    return list(Balance.objects.filter(account_id=account_id).order_by(*LOCK_ORDER).select_for_update())


def account_lock(*, account_id: str) -> Account:
    """Lock one account row (freezes). Takes no balance row."""
    return Account.objects.filter(pk=account_id).order_by("pk").select_for_update().get()


def hold_lock(*, hold_id: str) -> Hold:
    """Lock one hold row (a business row: before any balance row)."""
    return Hold.objects.filter(pk=hold_id).order_by("pk").select_for_update().get()


# --- Staff adjustments (payments.services.approvals) ------------------------------------


def staff_member_lock(*, staff_id: str) -> StaffMember:
    """A staff member's row, held while their adjustment is counted against the approval
    threshold and posted: two requests of one member cannot both see room under it."""
    return StaffMember.objects.filter(pk=staff_id).order_by("pk").select_for_update(no_key=True).get()


# --- Staged data migrations (wallets.staged) ------------------------------------------
# Customer rows are business rows: a contact update locks one; the contact backfill locks a
# batch in id order (FOR NO KEY UPDATE, so inserts that reference a customer, taking KEY
# SHARE, never wait on it). No transaction holds a customer row and then another in a
# different order, and no posting locks customer rows at all.


def customer_lock(*, customer_id: str) -> Customer:
    """Lock one customer row (a contact update). Takes no balance row."""
    return Customer.objects.filter(pk=customer_id).order_by("pk").select_for_update(no_key=True).get()


def customer_rows_lock(*, after: str, limit: int) -> list[str]:
    """Lock the next `limit` customer rows after id `after`, in id order (the contact
    backfill's batch); returns their ids."""
    return list(Customer.objects.filter(pk__gt=after).order_by("pk").select_for_update(no_key=True).values_list("pk", flat=True)[:limit])


def merchant_balance_rows_lock(*, account_ids: list[str]) -> int:
    """Lock every balance row (all assets, all shards) of some merchant accounts with ONE
    statement in the global order (the daily-totals backfill: while it holds them no posting
    can add to those merchants' daily totals). Returns how many rows it locked."""
    if not account_ids:
        return 0
    rows = Balance.objects.filter(account_id__in=account_ids).order_by(*LOCK_ORDER).select_for_update().values_list("pk", flat=True)
    return len(list(rows))


def staged_state_lock(*, name: str) -> StagedMigrationState:
    """Lock (creating it first if needed) a staged migration's state row in this tenant."""
    StagedMigrationState.objects.get_or_create(name=name)
    return StagedMigrationState.objects.filter(pk=name).order_by("pk").select_for_update().get()


@contextmanager
def advisory_lock_try(*, name: str) -> Iterator[bool]:
    """A session-level advisory lock named `name` within the tenant schema, tried (never
    waited for). Yields whether it was taken; released when the block ends, or by
    PostgreSQL with the session if the process dies (so a killed holder never blocks the
    next one). No row lock: it orders nothing against the rows above."""
    key = f"{getattr(connection, 'schema_name', 'public')}:{name}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key])
        row = cursor.fetchone()
    taken = bool(row and row[0])
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])


@contextmanager
def staged_run_lock(*, name: str) -> Iterator[bool]:
    """One runner of the staged migration `name` at a time in a tenant (advisory_lock_try).
    Yields False when another session holds it."""
    with advisory_lock_try(name=f"tally.staged:{name}") as taken:
        yield taken
