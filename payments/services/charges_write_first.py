"""The write-first charge: a speed variant of the same steps as the lock-first charge
(payments.services.charges), kept because it measured 11.5 % of a keyed payment's CPU,
and remembering the parties' accounts 11.0 % (docs/BENCHMARKS.md).

It reads its plan (rows, accounts, assets; no lock), or takes its parties' accounts from
an earlier payment of theirs in this process; then, in a savepoint, writes its rows, and
only then locks the balance rows for the checks and the one UPDATE of the balances: under
one hot wallet, payments pass one at a time for as long as the row is locked. Anything
but the plain case (no enclosing transaction, first rewards, empty or frozen wallets,
rewards near a cap, remembered accounts the locked rows do not bear out) writes nothing,
or rolls its savepoint back, and returns None: the caller then charges lock first.
Captures never come here.

A payment made here has its `created` (and its ledger rows', and the day its merchant
totals count it in) taken when it was written: before the lock wait, which the keyed API
bounds by the tenant's wait budget (the claim sets `lock_timeout` for the transaction).
Balances move in lock order; `created` order can differ from it by that wait.

Locks (`charge_write_first`): a savepoint; then the charge's balance rows, by account, in
one statement in the global order (wallets.locks.balance_rows_lock), the same rows the
lock-first path locks.
"""

from __future__ import annotations

from dataclasses import replace

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from payments.models import Payment
from payments.services.charge_rows import Parties, charge_accounts_of, charge_legs, charge_rows_wanted, payment_rows_new, rewards_cut
from wallets import ids
from wallets.locks import BalanceWant, LockedBalances, balance_rows_lock, balance_rows_read_by_owner
from wallets.models import Account, AccountKind, LedgerTransactionKind
from wallets.rows import rows_insert_in_savepoint
from wallets.selectors import MovementAccounts
from wallets.services.ledger import available, ledger_post, ledger_rows_new, ledger_wants


class _RewardCapMoved(Exception):
    """The locked rows cut a reward the plan did not: the payment is redone locking first."""


def charge_write_first(parties: Parties, *, asset_code: str, amount: int, points: int, grams: int) -> Payment | None:
    """The usual payment, with its balance rows locked only for the checks, the balance
    UPDATE and what follows it to COMMIT: the ledger transaction, its entries, the payment
    and its event are written before the lock, inside a savepoint that a refusal rolls
    back (so, as on the other path, a refusal leaves nothing written).

    The plan is the rows read without a lock. Anything but the plain case in it (a missing
    row, a frozen wallet, short funds, a reward a cap would cut) returns None having
    written nothing, and the caller takes the locking-first path, which decides those on
    locked rows. Once locked, the same checks run again in `ledger_post`; a refusal there
    (a freeze or a spend that committed since the plan) rolls the savepoint back and raises,
    and a reward cut that appeared since is redone locking first.

    A payment whose parties' accounts this process remembers (below) reads no plan: the
    locked rows decide everything, refusals included (a frozen wallet or short funds is
    refused there, with the savepoint rolled back), and rows that do not match the
    remembered accounts send it locking first.

    Locks: a savepoint; then the balance rows, by account, in one statement in the global
    order (wallets.locks.balance_rows_lock).
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
    """The plan: the payment's rows read without a lock, and its accounts if it is the
    plain case (every row there, no frozen wallet, the funds there, no reward cut)."""
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


# --- Accounts known from an earlier payment of the same parties ---------------------------
#
# The plan read (one SELECT of six rows with their accounts and assets) was the usual
# payment's most expensive statement in Python. What a payment needs from it, the account
# ids of its parties, does not change: so each process remembers them per (tenant schema,
# customer, merchant, asset, which rewards) after a payment that read them and
# succeeded, and the next payment of the same parties writes first without reading. The
# memory is only a hint. The locking SELECT, by those account ids, is where every check
# is made anyway (frozen rows and accounts, funds, caps, all read under the lock); with
# remembered accounts it also makes no missing row, and checks that each row it locked is
# there and belongs to the party it was remembered for (an account's kind and owner never
# change). If not, the savepoint goes back and the payment is made locking first; on a
# refusal it goes back and the refusal is raised. Either way, and on any failure once the
# rows are sent, the entry is forgotten: the next payment reads its plan. Entries hold
# accounts that were not frozen when read; their `frozen` may be stale only towards "not
# frozen", which the locked rows' check (`_frozen_refuse`) overrides. Nothing else read
# from them can be stale: `ledger_post` and the daily totals read their id and kind.

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
    """Forget every remembered account (tests; nothing depends on it for correctness)."""
    _KNOWN_ACCOUNTS.clear()


def _accounts_hold(locked: LockedBalances, accounts: MovementAccounts, parties: Parties, wants: list[BalanceWant]) -> bool:
    """Every wanted row was locked, and each remembered account, as read with its rows
    under the lock, is still the account of the party it was remembered for."""
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
