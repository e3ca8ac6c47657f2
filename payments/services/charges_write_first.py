"""The write-first charge: a speed variant of the lock-first charge (charges.py), kept
because it measured 11.5 % of a keyed payment's CPU, and remembering the parties' accounts
11.0 % (docs/BENCHMARKS.md). It writes its rows in a savepoint and only then locks the
balance rows for the checks and the one UPDATE, so a hot wallet's row is held for less.
Anything but the plain case writes nothing, or rolls its savepoint back, and returns None:
the caller then charges lock first. Captures never come here.

A payment made here takes its `created` when written, before the lock wait (bounded by the
claim's `lock_timeout`): `created` order can differ from lock order by that wait.
"""

from __future__ import annotations

from dataclasses import replace

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from payments.models import Payment
from payments.services.charge_rows import Parties, charge_accounts_of, charge_legs, charge_rows_wanted, payment_rows_new, rewards_cut
from wallets import ids
from wallets.locks import BalanceWant, LockedBalances, balance_rows_lock, balance_rows_read_by_owner, rows_insert_in_savepoint
from wallets.models import Account, AccountKind, LedgerTransactionKind
from wallets.selectors import MovementAccounts
from wallets.services.ledger import available, ledger_post, ledger_rows_new, ledger_wants


class _RewardCapMoved(Exception):
    """The locked rows cut a reward the plan did not: the payment is redone locking first."""


def charge_write_first(parties: Parties, *, asset_code: str, amount: int, points: int, grams: int) -> Payment | None:
    """The ledger rows, the payment and its event are written in a savepoint, then the
    balance rows are locked and `ledger_post` checks again on them: a refusal rolls the
    savepoint back and raises; a reward cut that appeared since the plan, or locked rows
    that do not bear out remembered accounts, roll back and return None.

    Locks: a savepoint; then the balance rows, by account, in one statement in the global
    order (wallets.locks.balance_rows_lock), the rows the lock-first path locks.
    """
    if not connection.in_atomic_block:
        return None  # no savepoint outside a transaction: the locking-first path refuses that
    known_key = (str(getattr(connection, "schema_name", "")), parties.customer_id, parties.merchant_id, asset_code, points > 0, grams > 0)
    accounts = _KNOWN_ACCOUNTS.get(known_key)
    from_plan = accounts is None
    if accounts is None:
        accounts = _plan_accounts(parties, asset_code=asset_code, amount=amount, points=points, grams=grams)
        if accounts is None:
            return None
    customer = accounts.customer
    assert customer is not None

    now = timezone.now()
    payment_id = ids.new_payment_id()
    legs = charge_legs(accounts, asset_code=asset_code, amount=amount, points=points, grams=grams)
    txn, entries = ledger_rows_new(kind=LedgerTransactionKind.PAYMENT, reference=payment_id, legs=legs, created=now)
    payment, event = payment_rows_new(
        parties, payment_id=payment_id, txn_id=txn.id, asset_code=asset_code, amount=amount, points=points, grams=grams, now=now
    )
    savepoint = rows_insert_in_savepoint([txn], entries, [payment], [event])  # a failure here rolled its rows back already
    try:
        wants = ledger_wants(legs)
        if from_plan:
            locked = balance_rows_lock(wants=wants)
        else:
            # Accounts from memory are checked on the locked rows, and make no row.
            locked = balance_rows_lock(wants=[replace(want, creatable=False) for want in wants])
            if not _accounts_hold(locked, accounts, parties, wants):
                raise _KnownAccountsWrong()
        if rewards_cut(locked, customer=customer, points=points, grams=grams) != (points, grams):
            raise _RewardCapMoved()
        ledger_post(kind=LedgerTransactionKind.PAYMENT, reference=payment_id, legs=legs, locked=locked, created=now, written=txn)
    except BaseException as failure:
        # Whatever stops it (a refusal, a lock timeout, a deadlock, a bug), the rows it wrote
        # go. After a refusal the caller's transaction may carry on; after a statement that
        # failed under Django's mark_for_rollback_on_error, the rollback below is refused
        # (TransactionManagementError) and the whole transaction ends rolled back instead.
        try:
            transaction.savepoint_rollback(savepoint)
        except DatabaseError:
            pass  # the connection is gone: so is everything this transaction wrote
        _KNOWN_ACCOUNTS.pop(known_key, None)  # the next payment of these parties reads its plan
        if isinstance(failure, (_RewardCapMoved, _KnownAccountsWrong)):
            return None
        raise
    if from_plan:
        _known_accounts_remember(known_key, accounts)
    return payment


def _plan_accounts(parties: Parties, *, asset_code: str, amount: int, points: int, grams: int) -> MovementAccounts | None:
    """The payment's accounts, read without a lock, if it is the plain case: every row
    there, no frozen wallet, the funds there, no reward cut."""
    wanted = charge_rows_wanted(parties, asset_code=asset_code, points=points, grams=grams)
    plan = balance_rows_read_by_owner(rows=wanted)
    if len(plan.rows) != len(wanted):
        return None
    accounts = charge_accounts_of(plan, parties)
    customer, merchant = accounts.customer, accounts.merchant
    if customer is None or merchant is None or customer.frozen or merchant.frozen:
        return None
    if available(locked=plan, account=customer, asset_code=asset_code) < amount:
        return None
    if rewards_cut(plan, customer=customer, points=points, grams=grams) != (points, grams):
        return None
    return accounts


# Accounts known from an earlier payment of the same parties, per process: only a hint.
# The account ids of a payment's parties never change, so a remembered entry saves the plan
# read. Every check is made under the lock anyway; with remembered accounts the lock makes
# no missing row and checks each locked row belongs to the party it was remembered for.
# Any failure forgets the entry. A remembered `frozen` can be stale only towards "not
# frozen", which the locked rows' check overrides.

_KnownKey = tuple[str, str, str, str, bool, bool]  # schema, customer, merchant, asset, points?, carbon?
_KNOWN_ACCOUNTS_MAX = 4_096  # about 2.5 KB an entry: ~10 MB a process at most
_KNOWN_ACCOUNTS: dict[_KnownKey, MovementAccounts] = {}


class _KnownAccountsWrong(Exception):
    """The locked rows do not match the remembered accounts: the payment is made locking first."""


def _known_accounts_remember(key: _KnownKey, accounts: MovementAccounts) -> None:
    if len(_KNOWN_ACCOUNTS) >= _KNOWN_ACCOUNTS_MAX:
        _KNOWN_ACCOUNTS.clear()  # bounded; the busiest parties come back at their next payment
    _KNOWN_ACCOUNTS[key] = accounts


def known_accounts_forget() -> None:
    """Forget every remembered account (tests and benchmarks)."""
    _KNOWN_ACCOUNTS.clear()


def _accounts_hold(locked: LockedBalances, accounts: MovementAccounts, parties: Parties, wants: list[BalanceWant]) -> bool:
    """Every wanted row was locked, and each remembered account, as read under the lock, is
    still the account of the party it was remembered for."""
    if len(locked.rows) != len(wants) or not all(locked.covers(want) for want in wants):
        return False
    fresh = {row.account_id: row.account for row in locked.rows.values()}
    parties_of: list[tuple[Account | None, AccountKind, str]] = [
        (accounts.customer, AccountKind.CUSTOMER, parties.customer_id),
        (accounts.merchant, AccountKind.MERCHANT, parties.merchant_id),
        *((account, AccountKind.SYSTEM, role) for role, account in accounts.system.items()),
    ]
    for remembered, kind, owner in parties_of:
        account = fresh.get(remembered.pk) if remembered is not None else None
        if account is None or account.kind != kind or owner not in (account.customer_id, account.merchant_id, account.system_role):
            return False
    return True
