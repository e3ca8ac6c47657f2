"""The ledger's one write path: balanced postings that move balances with them, and holds.
Every money movement posts through `ledger_post` in the caller's transaction; its rules
live here once (frozen wallets, funds, caps, double entry), all checked before the first
write, so a refusal leaves nothing behind.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from wallets.daily_totals import account_daily_totals_record
from wallets.errors import CapExceeded, InsufficientFunds, WalletFrozen
from wallets.locks import ALL_SHARDS, BalanceWant, LockedBalances, balance_rows_add, balance_rows_lock, balance_want, hold_lock, rows_insert
from wallets.models import (
    BALANCE_SHARDS,
    CARBON_ASSET,
    POINTS_ASSET,
    Account,
    AccountKind,
    Asset,
    AssetKind,
    Balance,
    Hold,
    HoldStatus,
    LedgerEntry,
    LedgerTransaction,
    SystemRole,
)


@dataclass(frozen=True)
class Leg:
    """One side of a posting: + credits the account, - debits it."""

    account: Account
    asset_code: str
    amount: int


def ledger_wants(legs: Iterable[Leg]) -> list[BalanceWant]:
    """The balance rows a posting of `legs` touches (for `balance_rows_lock`)."""
    return [balance_want(account=account, asset_code=asset, amount=amount) for (account, asset), amount in _net(legs).items()]


def ledger_post(
    *,
    kind: str,
    reference: str,
    legs: Sequence[Leg],
    locked: LockedBalances | None = None,
    allow_frozen: bool = False,
    created: datetime | None = None,
    consume_hold: Hold | None = None,
    written: LedgerTransaction | None = None,
) -> LedgerTransaction:
    """Post one balanced ledger transaction and move the balances with it. Raises
    WalletFrozen (checked on the legs' accounts and again on the locked rows, whose flags
    are current), InsufficientFunds, CapExceeded before writing.

    `locked`: rows the caller locked already (to decide the legs, e.g. rewards under a cap),
    covering `ledger_wants(legs)`. `consume_hold`: an active hold, locked by the caller, on
    a row this posting debits: available to it and released in the same update (a capture
    locks its rows once). `written`: these legs' rows from `ledger_rows_new`, inserted in a
    savepoint the caller rolls back if this refuses.

    Locks: the legs' balance rows in the global order, one statement; then the day's
    summary row of each leg (wallets.daily_totals).
    """
    if written is None:
        _legs_validate(legs)
    if not allow_frozen and any(leg.account.frozen for leg in legs if leg.account.kind != AccountKind.SYSTEM):
        raise WalletFrozen("the wallet is frozen", param=None)
    net = _net(legs)
    wants = [balance_want(account=account, asset_code=asset, amount=amount) for (account, asset), amount in net.items()]
    if locked is None:
        locked = balance_rows_lock(wants=wants)
    elif not all(locked.covers(want) for want in wants):
        raise ValueError("the locked balances do not cover this posting")

    # Check everything against the locked rows before the first write.
    deltas: dict[int, int] = defaultdict(int)
    held_deltas: dict[int, int] = {}
    if consume_hold is not None:
        if consume_hold.status != HoldStatus.ACTIVE:
            raise ValueError(f"hold {consume_hold.pk} is {consume_hold.status}")
        hold_row = locked.row(account=consume_hold.account, asset_code=consume_hold.asset_id)
        if hold_row is None or net.get((consume_hold.account, consume_hold.asset_id), 0) >= 0:
            raise ValueError("a consumed hold must be on a row this posting debits")
        held_deltas[hold_row.pk] = -consume_hold.amount
    if not allow_frozen:
        _frozen_refuse(locked, wants)
    for want in wants:
        amount = net[(want.account, want.asset_code)]
        if want.shard == ALL_SHARDS:
            _merchant_debit_plan(locked.shards(account=want.account, asset_code=want.asset_code), -amount, deltas)
            continue
        row = locked.row(account=want.account, asset_code=want.asset_code, shard=want.shard)
        if row is None:
            if not want.creatable:  # a debit of a wallet that never held this asset
                raise InsufficientFunds("insufficient funds", param="amount")
            raise ValueError(f"balance row {want} was not locked")  # balance_rows_lock makes creatable rows
        if want.account.kind == AccountKind.CUSTOMER:
            if amount < 0 and row.balance - row.held - held_deltas.get(row.pk, 0) < -amount:
                raise InsufficientFunds("insufficient funds", param="amount")
            cap = row.asset.cap
            if amount > 0 and cap is not None and row.balance + amount > cap:
                raise CapExceeded(f"the wallet's {want.asset_code} balance would exceed its cap of {cap}", param="amount")
        deltas[row.pk] += amount

    balance_rows_add(changes=deltas, held_changes=held_deltas)
    if consume_hold is not None:
        consume_hold.status = HoldStatus.CAPTURED
        consume_hold.save(update_fields=["status", "updated"])
    if written is None:
        txn, entries = ledger_rows_new(kind=kind, reference=reference, legs=legs, created=created or timezone.now())
        rows_insert([txn], entries)
    elif (written.kind, written.reference) != (kind, reference):
        raise ValueError(f"written transaction {written.pk} is not this posting's")
    else:
        txn = written
    account_daily_totals_record(kind=kind, legs=[(leg.account, leg.asset_code, leg.amount) for leg in legs], created=txn.created)
    return txn


def ledger_rows_new(*, kind: str, reference: str, legs: Sequence[Leg], created: datetime) -> tuple[LedgerTransaction, list[LedgerEntry]]:
    """A balanced transaction and its entries, unsaved (the payment path inserts them with its
    own rows, then passes them to `ledger_post(written=)`). Moves no balance."""
    _legs_validate(legs)
    txn = LedgerTransaction(kind=kind, reference=reference, created=created)
    entries = [LedgerEntry(transaction=txn, account=leg.account, asset_id=leg.asset_code, amount=leg.amount, created=created) for leg in legs]
    return txn, entries


def _frozen_refuse(locked: LockedBalances, wants: Sequence[BalanceWant]) -> None:
    """WalletFrozen if a locked row of a non-system party, or its account (a row made from a
    stale account), is frozen: every row, before any funds or cap check."""
    for want in wants:
        if want.shard == ALL_SHARDS or want.account.kind == AccountKind.SYSTEM:
            continue
        row = locked.row(account=want.account, asset_code=want.asset_code, shard=want.shard)
        if row is not None and (row.frozen or row.account.frozen):
            raise WalletFrozen("the wallet is frozen", param=None)


def cap_room(*, locked: LockedBalances, account: Account, asset_code: str) -> int | None:
    """How much more a customer's locked row may be credited under its cap; None: uncapped."""
    row = locked.row(account=account, asset_code=asset_code)
    if row is None or row.asset.cap is None:
        return None
    return max(0, row.asset.cap - row.balance)


def available(*, locked: LockedBalances, account: Account, asset_code: str) -> int:
    """balance - held of a customer's locked (account, asset) row (0 if it has none)."""
    row = locked.row(account=account, asset_code=asset_code)
    return 0 if row is None else row.balance - row.held


def _merchant_debit_plan(shards: list[Balance], amount: int, deltas: dict[int, int]) -> None:
    """Take `amount` from a merchant's shards, lowest first; refuse if they do not cover it."""
    if sum(r.balance - r.held for r in shards) < amount:
        raise InsufficientFunds("the merchant's balance does not cover this", param="amount")
    remaining = amount
    for row in shards:
        take = min(row.balance - row.held, remaining)
        if take > 0:
            deltas[row.pk] -= take
            remaining -= take


def _net(legs: Iterable[Leg]) -> dict[tuple[Account, str], int]:
    """Net change per (account, asset), zero changes dropped (entries keep every leg)."""
    net: dict[tuple[str, str], int] = defaultdict(int)
    accounts: dict[str, Account] = {}
    for leg in legs:
        net[(leg.account.id, leg.asset_code)] += leg.amount
        accounts[leg.account.id] = leg.account
    return {(accounts[account_id], asset): amount for (account_id, asset), amount in net.items() if amount != 0}


def _legs_validate(legs: Sequence[Leg]) -> None:
    if len(legs) < 2:
        raise ValueError("a ledger transaction has at least two entries")
    per_asset: dict[str, int] = defaultdict(int)
    for leg in legs:
        if type(leg.amount) is not int:
            raise TypeError(f"ledger amounts are int minor units, not {type(leg.amount).__name__}")
        if leg.amount == 0:
            raise ValueError("zero ledger entry")
        per_asset[leg.asset_code] += leg.amount
    unbalanced = {code: total for code, total in per_asset.items() if total != 0}
    if unbalanced:
        raise ValueError(f"ledger transaction does not sum to zero: {unbalanced}")


def hold_place(*, account: Account, asset_code: str, amount: int, reference: str) -> Hold:
    """Reserve `amount` of a customer's available balance. Raises WalletFrozen,
    InsufficientFunds before writing. Locks: the customer's balance row."""
    if account.frozen:
        raise WalletFrozen("the wallet is frozen", param=None)
    locked = balance_rows_lock(wants=[BalanceWant(account, asset_code, 0, creatable=False)])
    row = locked.row(account=account, asset_code=asset_code)
    if row is not None and row.frozen:
        raise WalletFrozen("the wallet is frozen", param=None)
    if row is None or row.balance - row.held < amount:
        raise InsufficientFunds("insufficient funds", param="amount")
    Balance.objects.filter(pk=row.pk).update(held=F("held") + amount)
    return Hold.objects.create(account=account, asset_id=asset_code, amount=amount, reference=reference)


def hold_release(*, hold: Hold, status: HoldStatus = HoldStatus.RELEASED) -> Hold:
    """Give an active hold's amount back to the available balance (else a no-op). Locks: the
    hold row, then the customer's balance row."""
    locked_hold = hold_lock(hold_id=hold.pk)
    if locked_hold.status != HoldStatus.ACTIVE:
        return locked_hold
    locked = balance_rows_lock(wants=[BalanceWant(locked_hold.account, locked_hold.asset_id, 0, creatable=False)])
    row = locked.row(account=locked_hold.account, asset_code=locked_hold.asset_id)
    assert row is not None
    Balance.objects.filter(pk=row.pk).update(held=F("held") - locked_hold.amount)
    locked_hold.status = status
    locked_hold.save(update_fields=["status", "updated"])
    return locked_hold


def balance_rows_create(*, accounts: Iterable[Account], asset_codes: Iterable[str] | None = None) -> None:
    """The empty balance rows of accounts in every asset (or `asset_codes`), every shard of a
    merchant or system account; idempotent. Made up front: a row made during a posting is
    made outside its one locking statement. Locks: none (new rows)."""
    codes = list(asset_codes) if asset_codes is not None else list(Asset.objects.values_list("code", flat=True))
    rows = [
        account.balance_new(asset_code=code, shard=shard)
        for account in accounts
        for code in codes
        for shard in (range(1) if account.kind == AccountKind.CUSTOMER else range(BALANCE_SHARDS))
    ]
    Balance.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)


@transaction.atomic
def asset_create(*, code: str, name: str, kind: str, exponent: int = 0, cap: int | None = None) -> Asset:
    """A new asset, with a balance row for every existing account. Locks: none (new rows)."""
    asset = Asset(code=code, name=name, kind=kind, exponent=exponent, cap=cap)
    asset.full_clean()
    asset.save(force_insert=True)
    accounts = Account.objects.order_by("id")
    for start in range(0, accounts.count(), 2000):
        balance_rows_create(accounts=accounts[start : start + 2000], asset_codes=[code])
    return asset


@transaction.atomic
def tenant_ledger_bootstrap(*, main_currency: str, exponent: int) -> None:
    """A new tenant's standard assets (its main currency payable to merchants) and system
    accounts with their balance rows (idempotent)."""
    Asset.objects.get_or_create(
        code=main_currency,
        defaults={"name": main_currency, "kind": AssetKind.CURRENCY, "exponent": exponent, "is_main": True, "payable": True},
    )
    Asset.objects.get_or_create(code=POINTS_ASSET, defaults={"name": "Points", "kind": AssetKind.POINTS, "exponent": 0})
    Asset.objects.get_or_create(code=CARBON_ASSET, defaults={"name": "Carbon credits (g CO2)", "kind": AssetKind.CARBON, "exponent": 0})
    system = [Account.objects.get_or_create(system_role=role, defaults={"kind": AccountKind.SYSTEM})[0] for role in SystemRole]
    balance_rows_create(accounts=system)
