"""Ledger primitives: balanced postings, balance row locks (the one lock order), holds.

Callers run these inside a transaction (payments.services does, via run_atomic); nothing
here opens its own. The payment hot path is the PL/pgSQL function tally_payment_create
(payments/migrations/0002) and follows the same lock order.

Lock order (deadlock freedom depends on everyone using it):
  1. business rows (payment, intent) before any balance;
  2. balance rows by lock_key: customer accounts, then merchant accounts, then system
     accounts; customers and merchants by account id, system accounts by role (PSP
     funding, adjustments, fees, bonus pool, carbon registry); within an account the
     non-reward assets before the reward assets (CARBON, POINT), each group by code;
     shards ascending;
  3. carbon aggregates (customer row, then a merchant shard) last.
Credits to a merchant or system account take one shard and need no check, so they are
written last; debits of a merchant lock all its shards of that asset.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import F, Sum
from django.utils import timezone

from payments.errors import CapExceeded, InsufficientFunds, WalletFrozen
from wallets.models import (
    BALANCE_SHARDS,
    CARBON_ASSET,
    POINTS_ASSET,
    Account,
    AccountKind,
    Asset,
    Balance,
    Hold,
    HoldStatus,
    LedgerEntry,
    LedgerTransaction,
    SystemRole,
)

_KIND_RANK = {AccountKind.CUSTOMER: 0, AccountKind.MERCHANT: 1, AccountKind.SYSTEM: 2}
REWARD_ASSETS = frozenset({POINTS_ASSET, CARBON_ASSET})


@dataclass(frozen=True)
class Leg:
    """One side of a posting: + credits the account, - debits it."""

    account: Account
    asset_code: str
    amount: int


# System accounts in a fixed order, the one tally_payment_create uses (bonus pool, then
# carbon registry); their ids are random, so ordering them by id would not match it.
_SYSTEM_ROLE_RANK = {role: rank for rank, role in enumerate(
    [SystemRole.PSP_FUNDING, SystemRole.ADJUSTMENTS, SystemRole.FEES, SystemRole.BONUS_POOL, SystemRole.CARBON_REGISTRY]
)}


def lock_key(*, account: Account, asset_code: str) -> tuple[int, str, int, str]:
    """Position of (account, asset) in the global lock order (see the module docstring)."""
    owner = account.id
    if account.kind == AccountKind.SYSTEM and account.system_role:
        owner = f"{_SYSTEM_ROLE_RANK[SystemRole(account.system_role)]:02d}"
    return (_KIND_RANK[AccountKind(account.kind)], owner, 1 if asset_code in REWARD_ASSETS else 0, asset_code)


def system_account(*, role: SystemRole) -> Account:
    return Account.objects.get(system_role=role)


def balance_rows_lock(*, account: Account, asset_code: str) -> list[Balance]:
    """Lock (FOR UPDATE) every shard row of (account, asset), ascending shard. Callers take
    these in lock_key order."""
    return list(Balance.objects.filter(account=account, asset_id=asset_code).order_by("shard", "pk").select_for_update())


def customer_balance_row_lock(*, account: Account, asset_code: str) -> Balance:
    """Lock a customer's (single) balance row, creating it empty first if it does not exist."""
    _balance_row_ensure(account=account, asset_code=asset_code, shard=0)
    return Balance.objects.filter(account=account, asset_id=asset_code, shard=0).order_by("pk").select_for_update().get()


def _balance_row_ensure(*, account: Account, asset_code: str, shard: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO wallets_balance (account_id, asset_id, shard, balance, held, may_go_negative) VALUES (%s, %s, %s, 0, 0, %s) "
            "ON CONFLICT (account_id, asset_id, shard) DO NOTHING",
            [account.id, asset_code, shard, account.kind == AccountKind.SYSTEM],
        )


def _balance_add_unchecked(*, account: Account, asset_code: str, amount: int) -> None:
    """Add `amount` to one shard of a merchant or system account (credit, or system debit).

    Takes the row lock of one shard only (a random one), so many of these run in parallel.
    """
    shard = random.randrange(BALANCE_SHARDS)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO wallets_balance AS b (account_id, asset_id, shard, balance, held, may_go_negative) VALUES (%s, %s, %s, %s, 0, %s) "
            "ON CONFLICT (account_id, asset_id, shard) DO UPDATE SET balance = b.balance + EXCLUDED.balance",
            [account.id, asset_code, shard, amount, account.kind == AccountKind.SYSTEM],
        )


def _frozen_accounts(accounts: Iterable[Account]) -> set[str]:
    return set(Account.objects.filter(id__in={a.id for a in accounts}, frozen=True).values_list("id", flat=True))


def ledger_post(
    *,
    kind: str,
    reference: str,
    legs: Sequence[Leg],
    allow_frozen: bool = False,
    created: datetime | None = None,
) -> LedgerTransaction:
    """Post one balanced ledger transaction and move the balances with it.

    Locks: every customer balance row of the legs and every shard of a debited merchant
    (asset) in lock_key order; then one shard per merchant credit / system leg. Checks
    (frozen, funds: balance - held >= amount, caps: balance + amount <= cap) all happen
    before the first write, so a refusal leaves nothing behind. Must run in a transaction.
    """
    _legs_validate(legs)
    if not allow_frozen:
        frozen = _frozen_accounts(leg.account for leg in legs if leg.account.kind != AccountKind.SYSTEM)
        if frozen:
            raise WalletFrozen("the wallet is frozen", param=None)
    caps = dict(Asset.objects.filter(code__in={leg.asset_code for leg in legs}).values_list("code", "cap"))
    # Checks and writes work on the net change per (account, asset); entries keep every leg.
    net: dict[tuple[str, str], int] = defaultdict(int)
    accounts: dict[str, Account] = {}
    for leg in legs:
        net[(leg.account.id, leg.asset_code)] += leg.amount
        accounts[leg.account.id] = leg.account
    ordered = sorted(
        ((accounts[account_id], asset_code, amount) for (account_id, asset_code), amount in net.items() if amount != 0),
        key=lambda item: lock_key(account=item[0], asset_code=item[1]),
    )

    # Phase 1: lock and check; nothing is written yet.
    plan: list[tuple[Account, str, int, list[tuple[Balance, int]]]] = []
    for account, asset_code, amount in ordered:
        if account.kind == AccountKind.CUSTOMER:
            row = customer_balance_row_lock(account=account, asset_code=asset_code)
            if amount < 0 and row.balance - row.held < -amount:
                raise InsufficientFunds("insufficient funds", param="amount")
            cap = caps.get(asset_code)
            if amount > 0 and cap is not None and row.balance + amount > cap:
                raise CapExceeded(f"the wallet's {asset_code} balance would exceed its cap of {cap}", param="amount")
            plan.append((account, asset_code, amount, [(row, amount)]))
        elif account.kind == AccountKind.MERCHANT and amount < 0:
            rows = balance_rows_lock(account=account, asset_code=asset_code)
            if sum(r.balance - r.held for r in rows) < -amount:
                raise InsufficientFunds("the merchant's balance does not cover this", param="amount")
            remaining = -amount
            takes: list[tuple[Balance, int]] = []
            for row in rows:
                take = min(row.balance - row.held, remaining)
                if take > 0:
                    takes.append((row, -take))
                    remaining -= take
            plan.append((account, asset_code, amount, takes))
        else:
            plan.append((account, asset_code, amount, []))

    # Phase 2: write balances and entries.
    for account, asset_code, amount, changes in plan:
        if changes:
            for row, delta in changes:
                Balance.objects.filter(pk=row.pk).update(balance=F("balance") + delta)
        else:
            _balance_add_unchecked(account=account, asset_code=asset_code, amount=amount)
    now = created or timezone.now()
    txn = LedgerTransaction.objects.create(kind=kind, reference=reference, created=now)
    LedgerEntry.objects.bulk_create(
        [LedgerEntry(transaction=txn, account=leg.account, asset_id=leg.asset_code, amount=leg.amount, created=now) for leg in legs]
    )
    return txn


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


# --- Holds --------------------------------------------------------------------------


def hold_place(*, account: Account, asset_code: str, amount: int, reference: str) -> Hold:
    """Reserve `amount` of a customer's available balance.

    Locks: the customer's balance row (account, asset). Raises InsufficientFunds before writing.
    """
    row = customer_balance_row_lock(account=account, asset_code=asset_code)
    if row.balance - row.held < amount:
        raise InsufficientFunds("insufficient funds", param="amount")
    Balance.objects.filter(pk=row.pk).update(held=F("held") + amount)
    return Hold.objects.create(account=account, asset_id=asset_code, amount=amount, reference=reference)


def hold_release(*, hold: Hold, status: HoldStatus = HoldStatus.RELEASED) -> Hold:
    """Give a hold's amount back to the available balance.

    Locks: the hold row, then the customer's balance row. A hold that is no longer active
    is left as it is (releasing twice is a no-op).
    """
    locked = Hold.objects.filter(pk=hold.pk).order_by("pk").select_for_update().get()
    if locked.status != HoldStatus.ACTIVE:
        return locked
    row = customer_balance_row_lock(account=locked.account, asset_code=locked.asset_id)
    Balance.objects.filter(pk=row.pk).update(held=F("held") - locked.amount)
    locked.status = status
    locked.save(update_fields=["status", "updated"])
    return locked


# --- Reads used by selectors and checks ---------------------------------------------


def account_balance(*, account: Account, asset_code: str) -> tuple[int, int]:
    """(balance, held) of an account in one asset: the SUM over its shards."""
    totals = Balance.objects.filter(account=account, asset_id=asset_code).aggregate(balance=Sum("balance"), held=Sum("held"))
    return int(totals["balance"] or 0), int(totals["held"] or 0)
