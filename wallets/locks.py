"""Every row lock the ledger takes, in the one global order; and the money path's writes of
the rows it holds (`balance_rows_add`) and of new rows (`rows_insert`, fastpath.compiled).

Deadlock freedom depends on every writer using these helpers, never an inline
`select_for_update()`. The global order:
  1. business rows (payments/locks.py); before them a staff member's solo postings in one
     asset (`staff_solo_postings_lock`) and a fenced completion's idempotency record;
  2. balance rows, all in ONE statement per transaction, ORDER BY `LOCK_ORDER`: PostgreSQL
     locks rows as the sort emits them, so two transactions meet their common rows in the
     same order. None locks balance rows twice (a rolled-back savepoint's rows are released);
  3. a freeze: all the account's balance rows, then the account row;
  4. a posting's daily-total rows (wallets.daily_totals: merchants', and customers' and
     system accounts' once their staged migration writes them), in key order, only where it
     holds a balance row every other writer of that summary row holds too (the same shard,
     every shard, or a customer's single row), so they add no wait.
Customer rows are business rows no posting takes; merchant rows are locked alone (a payout
hold or schedule, `merchant_lock`) or FOR SHARE after a payout's row (its lease,
`merchant_share_lock`), never with balance rows; other apps' locks.py name the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import BigIntegerField, Case, F, Q, QuerySet, Value, When

from fastpath.compiled import CompiledQuery, CompiledShapes, Param

# New rows in one round trip (or in a savepoint of their own), for the money path's services.
from fastpath.compiled import rows_insert as rows_insert
from fastpath.compiled import rows_insert_in_savepoint as rows_insert_in_savepoint
from wallets.models import BALANCE_SHARDS, Account, AccountKind, ApiKey, Balance, Customer, Hold, Merchant, StagedMigrationState

ALL_SHARDS = -1
LOCK_ORDER = ("account_id", "asset_id", "shard")


def connection_shard() -> int:
    """The shard this connection credits: its backend pid modulo the shard count, so that
    with no more connections than shards, payments to one merchant rarely wait."""
    pid = connection.connection.info.backend_pid if connection.connection is not None else 0
    return int(pid) % BALANCE_SHARDS


@dataclass(frozen=True)
class BalanceWant:
    """A balance row a movement touches (ALL_SHARDS: a merchant debit); `creatable`: made empty if missing."""

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
    """Lock every balance row of `wants` (with its account and asset) in ONE statement, in the
    global order. Missing creatable rows are inserted empty first; a missing row that must
    exist (a debit of an empty wallet) is not: the caller refuses."""
    ordered = list(dict.fromkeys(wants))
    if not ordered:
        return LockedBalances([])
    locked = _select_for_update(ordered)
    missing = [w for w in ordered if not locked.covers(w)]
    if missing and all(w.creatable for w in missing):
        Balance.objects.bulk_create([w.account.balance_new(asset_code=w.asset_code, shard=w.shard) for w in missing], ignore_conflicts=True)
        locked = _select_for_update(ordered)
    return locked


def _select_for_update(ordered: list[BalanceWant]) -> LockedBalances:
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
    """Per (account, shard) group: whether it takes every shard, and its asset codes."""
    matches = Q()
    for index, (all_shards, assets) in enumerate(shape):
        if all_shards:
            matches |= Q(account_id=Param(f"account{index}"), asset_id__in=assets)
        else:
            matches |= Q(account_id=Param(f"account{index}"), shard=Param(f"shard{index}"), asset_id__in=assets)
    return CompiledQuery(_ordered_select(matches).select_for_update(of=("self",)), prepared=True)


# Columns of the joined rows no movement reads: leaving them out spares parsing two
# timestamps per row on every payment. tests/test_ledger.py checks that none is read.
UNREAD_JOINED_COLUMNS = ("account__created", "asset__created")


def _ordered_select(matches: Q) -> QuerySet[Balance]:
    return Balance.objects.filter(matches).select_related("account", "asset").defer(*UNREAD_JOINED_COLUMNS).order_by(*LOCK_ORDER)


_OWNER_FIELD = {
    AccountKind.CUSTOMER: "account__customer_id", AccountKind.MERCHANT: "account__merchant_id", AccountKind.SYSTEM: "account__system_role",
}


@dataclass(frozen=True)
class OwnerRow:
    """A balance row named by its owner (a customer id, a merchant id, or a system role)."""

    kind: AccountKind
    owner: str
    asset_code: str
    shard: int = 0


def balance_rows_lock_by_owner(*, rows: Iterable[OwnerRow]) -> LockedBalances:
    """Like `balance_rows_lock`, for rows named by owner: their accounts are found in the same
    statement (the payment path's one round trip), and missing rows are not made."""
    return _by_owner(rows=rows, lock=True)


def balance_rows_read_by_owner(*, rows: Iterable[OwnerRow]) -> LockedBalances:
    """The rows `balance_rows_lock_by_owner` would lock, read WITHOUT locking (a plan)."""
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
    """Whether it locks, then per group the owner's kind and its asset codes."""
    lock, *groups = shape
    matches = Q()
    for index, (kind, assets) in enumerate(groups):
        matches |= Q(**{_OWNER_FIELD[kind]: Param(f"owner{index}")}, shard=Param(f"shard{index}"), asset_id__in=assets)
    select = _ordered_select(matches)
    return CompiledQuery(select.select_for_update(of=("self",)) if lock else select, prepared=True)


# Compiled once per shape and process: compiling these selects cost more Python than the
# rest of a payment. Prepared: planning the join was most of PostgreSQL's work for one.
_BY_ACCOUNT: CompiledShapes[Balance] = CompiledShapes(_by_account_statement)
_BY_OWNER: CompiledShapes[Balance] = CompiledShapes(_by_owner_statement)


def balance_rows_add(*, changes: dict[int, int], held_changes: dict[int, int]) -> None:
    """One UPDATE of every changed balance row (balance and held += their changes); RuntimeError
    if a row is missing. Locks: none of its own (the caller holds every row already)."""
    balances = {pk: delta for pk, delta in changes.items() if delta != 0}
    if not balances and not held_changes:
        return
    rows = sorted(balances.keys() | held_changes.keys())
    values: dict[str, int] = {}
    for index, pk in enumerate(rows):
        values[f"row{index}"] = pk
        if balances:
            values[f"balance{index}"] = balances.get(pk, 0)
        if held_changes:
            values[f"held{index}"] = held_changes.get(pk, 0)
    updated = _BALANCES_ADD.get((len(rows), bool(balances), bool(held_changes))).update(**values)
    if updated != len(rows):
        raise RuntimeError(f"balance update changed {updated} of {len(rows)} locked rows")


def _balances_add_statement(shape: tuple[int, bool, bool]) -> CompiledQuery[Balance]:
    """UPDATE .. SET balance = balance + CASE id WHEN .. END [, held likewise] WHERE id IN (..)."""
    rows, balance, held = shape
    updates = {}
    if balance:
        updates["balance"] = F("balance") + _per_row("balance", rows=rows)
    if held:
        updates["held"] = F("held") + _per_row("held", rows=rows)
    return CompiledQuery(Balance.objects.filter(pk__in=[Param(f"row{i}") for i in range(rows)]), update=updates, prepared=True)


def _per_row(column: str, *, rows: int) -> Param | Case:
    if rows == 1:
        return Param(f"{column}0", output_field=BigIntegerField())
    whens = [When(pk=Param(f"row{i}"), then=Param(f"{column}{i}", output_field=BigIntegerField())) for i in range(rows)]
    return Case(*whens, default=Value(0), output_field=BigIntegerField())


# Compiled once per shape and process: compiling this UPDATE cost a quarter of a payment's Python.
_BALANCES_ADD: CompiledShapes[Balance] = CompiledShapes(_balances_add_statement)


def account_balance_rows_lock(*, account_id: str) -> list[Balance]:
    """Every balance row of one account, one statement in the global order (a freeze)."""
    return list(Balance.objects.filter(account_id=account_id).order_by(*LOCK_ORDER).select_for_update())


def account_lock(*, account_id: str) -> Account:
    """Lock one account row (freezes). Takes no balance row."""
    return Account.objects.filter(pk=account_id).order_by("pk").select_for_update().get()


def hold_lock(*, hold_id: str) -> Hold:
    """Lock one hold row (a business row: before any balance row)."""
    return Hold.objects.filter(pk=hold_id).order_by("pk").select_for_update().get()


SOLO_POSTINGS_LOCK_SPACE = 0x736F6C6F  # "solo"


def staff_solo_postings_lock(*, staff_id: str, asset_code: str) -> None:
    """Serialize what one staff member posts alone (no second approver) in one asset: a
    transaction-level advisory lock on (schema, staff member, asset), held until commit, so
    two such postings cannot both see room under the maker-checker threshold (the sum read
    after the lock sees what the previous holder committed). Taken before any business or
    balance row. Its two-int key space is its own: a hash collision can only make two staff
    postings wait for each other, never for an `advisory_lock_try` session lock."""
    if not connection.in_atomic_block:
        raise RuntimeError("staff_solo_postings_lock outside a transaction would be released at once")
    key = f"{getattr(connection, 'schema_name', 'public')}:{staff_id}:{asset_code}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [SOLO_POSTINGS_LOCK_SPACE, key])


def staff_api_keys_live_lock(*, staff_id: str) -> list[ApiKey]:
    """A staff member's unrevoked API key rows, in id order (a login deactivated). No balance row."""
    return list(ApiKey.objects.filter(staff_id=staff_id, revoked_at__isnull=True).order_by("pk").select_for_update())


# Customer rows are locked FOR NO KEY UPDATE, so inserts that reference a customer (KEY
# SHARE) never wait on them.
def customer_lock(*, customer_id: str) -> Customer:
    """Lock one customer row (a contact update). Takes no balance row."""
    return Customer.objects.filter(pk=customer_id).order_by("pk").select_for_update(no_key=True).get()


def customer_rows_lock(*, after: str, limit: int) -> list[str]:
    """The ids of the next `limit` customer rows after `after`, locked in id order (a contact batch)."""
    return list(Customer.objects.filter(pk__gt=after).order_by("pk").select_for_update(no_key=True).values_list("pk", flat=True)[:limit])


def merchant_lock(*, merchant_id: str) -> Merchant:
    """Lock one merchant row FOR NO KEY UPDATE (its payout hold or schedule changed): taken
    alone, no balance row after it; inserts that reference the merchant never wait on it."""
    return Merchant.objects.filter(pk=merchant_id).order_by("pk").select_for_update(no_key=True).get()


def merchant_share_lock(*, merchant_id: str) -> Merchant:
    """Lock one merchant row FOR SHARE (a payout's lease, after the payout row): the lease reads
    the payout hold as committed, and a hold being written and the lease wait for each
    other, so the one that locked first wins. No balance row after it. (Django's
    select_for_update has no FOR SHARE.)"""
    return next(iter(Merchant.objects.raw("SELECT * FROM wallets_merchant WHERE id = %s FOR SHARE", [merchant_id])))


def merchant_balance_rows_lock(*, account_ids: list[str]) -> int:
    """Every balance row of some accounts, ONE statement in the global order (the daily-totals
    backfills, merchants' and other accounts': no posting adds to their totals meanwhile);
    how many it locked."""
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
    """A session-level advisory lock `name` in the tenant schema, tried, never waited for;
    yields whether it was taken. Released at the block's end (or with the session). It
    orders nothing against the row locks above."""
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
    """One runner of the staged migration `name` at a time in a tenant (advisory_lock_try)."""
    with advisory_lock_try(name=f"tally.staged:{name}") as taken:
        yield taken
