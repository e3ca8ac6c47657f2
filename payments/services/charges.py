"""Charges: a customer paying a merchant, at a terminal (by customer id or scanned QR
token) or through a payment intent, in the caller's transaction; a refusal leaves nothing
written. Two strategies make the same payment (docs/ARCHITECTURE.md, "One keyed terminal
payment"): lock first (`_charge_locking_first`), which every charge can take, and write
first (`charge_write_first`), a speed variant (docs/BENCHMARKS.md) the usual payment tries
first; it writes its rows in a savepoint before it locks. Both want the same rows, post the
same legs and write the same payment and event. The payment's time (`created`) is taken
before any lock, as it picks the fee schedule, so it can precede the lock wait. Rewards, in
the tenant's main currency only: points (ROUND_FLOOR) from the bonus pool, carbon
(ROUND_HALF_EVEN) from the carbon registry, each cut to its asset's cap. The fee of the
schedule in force (payments.selectors.fee_terms_in_force, no query) goes to the fees account
in the same posting: the merchant gets amount - fee.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from payments.models import OutboxEvent, Payment, PaymentStatus
from payments.selectors import fee_terms_in_force
from payments.services.mandates import charge_by_customer_id_check
from payments.services.outbox import epoch_seconds, outbox_event_new
from payments.services.tokens import payment_token_consume
from tenants.selectors import tenant_current, tenant_rate
from wallets import ids
from wallets.errors import AssetUnknown, InsufficientFunds, NotFound, WalletFrozen
from wallets.locks import (
    BalanceWant,
    LockedBalances,
    OwnerRow,
    balance_rows_lock,
    balance_rows_lock_by_owner,
    balance_rows_read_by_owner,
    connection_shard,
    rows_insert,
    rows_insert_in_savepoint,
)
from wallets.models import CARBON_ASSET, POINTS_ASSET, Account, AccountKind, Customer, Hold, LedgerTransactionKind, SystemRole, Terminal
from wallets.money import amount_to_minor, carbon_grams_for, points_for
from wallets.selectors import MovementAccounts, asset_exists, movement_accounts_get
from wallets.services.ledger import Leg, available, cap_room, ledger_post, ledger_rows_new, ledger_wants
from wallets.transactions import atomic_service

SYSTEM_ROLES = (SystemRole.BONUS_POOL, SystemRole.CARBON_REGISTRY, SystemRole.FEES)


@dataclass(frozen=True)
class Parties:
    customer_id: str
    merchant_id: str
    store_id: str | None
    terminal_id: str | None


@dataclass(frozen=True)
class Charge:
    """What a charge moves, decided before any lock: the amount, the fee in force at `now`
    (the payment's time) and the rewards as planned (the locked rows may cut them)."""

    asset_code: str
    amount: int
    fee: int
    points: int
    grams: int
    now: datetime


@atomic_service(operation="payment_create")
def payment_create(
    *, terminal: Terminal, customer: Customer | None = None, customer_id: str | None = None, asset_code: object, amount: object
) -> Payment:
    """Take a payment from `customer` (or its `customer_id`) at `terminal`; by customer id
    only with the tenant's setting or a mandate (checked first). Locks: see `charge`."""
    minor = amount_to_minor(amount)
    if (customer is None) == (customer_id is None):
        raise TypeError("pass exactly one of customer and customer_id")
    payer_id = str(customer.pk) if customer is not None else str(customer_id)
    charge_by_customer_id_check(customer_id=payer_id, merchant_id=terminal.store.merchant_id)
    return _terminal_charge(terminal=terminal, customer_id=payer_id, asset_code=_asset_code_check(asset_code), amount=minor)


@atomic_service(operation="payment_create")
def payment_create_with_token(*, terminal: Terminal, customer_token: object, asset_code: object, amount: object) -> Payment:
    """Take a payment by the customer's scanned QR token. The token is consumed before the
    charge can refuse: a refusal aborts this transaction, which rolls the consumption back.
    Locks: the token row, then those of `charge`."""
    minor = amount_to_minor(amount)
    code = _asset_code_check(asset_code)
    customer_id = payment_token_consume(token=customer_token)
    return _terminal_charge(terminal=terminal, customer_id=customer_id, asset_code=code, amount=minor)


def _asset_code_check(asset_code: object) -> str:
    if not isinstance(asset_code, str) or not asset_code:
        raise AssetUnknown(param="asset")
    return asset_code


def _terminal_charge(*, terminal: Terminal, customer_id: str, asset_code: str, amount: int) -> Payment:
    return charge(
        customer_id=customer_id, merchant_id=terminal.store.merchant_id, store_id=terminal.store_id, terminal_id=terminal.pk,
        asset_code=asset_code, amount=amount,
    )


def charge(
    *,
    customer_id: str,
    merchant_id: str,
    store_id: str | None,
    terminal_id: str | None,
    asset_code: str,
    amount: int,
    consume_hold: Hold | None = None,
) -> Payment:
    """Customer -> merchant; `consume_hold`: a hold (locked by the caller) this charge
    captures (ledger_post). Captures never write first.
    Locks: the customer's balance rows (asset, POINT, CARBON) and the merchant's, bonus
    pool's, carbon registry's and fees account's shards, in one statement in the global order
    (wallets.locks); write first takes them after writing its rows in a savepoint. Refusals, in
    this order: NotFound (terminal or merchant, then customer), AssetUnknown, WalletFrozen, InsufficientFunds."""
    tenant = tenant_current()
    rewarded = asset_code == tenant.main_currency
    now = timezone.now()
    terms = fee_terms_in_force(merchant_id=merchant_id, asset_code=asset_code, at=now)
    plan = Charge(
        asset_code=asset_code, amount=amount, fee=terms.fee_of(amount) if terms is not None else 0,
        points=points_for(amount=amount, rate=tenant_rate(tenant, "points_earn_rate")) if rewarded else 0,
        grams=carbon_grams_for(amount=amount, grams_per_unit=tenant_rate(tenant, "carbon_grams_per_unit")) if rewarded else 0, now=now,
    )
    parties = Parties(customer_id=customer_id, merchant_id=merchant_id, store_id=store_id, terminal_id=terminal_id)
    # A fee of the whole amount leaves the merchant no leg, so nothing the write-first path
    # locks would show the merchant's account: such a charge locks first.
    if consume_hold is None and plan.fee < amount:
        payment = charge_write_first(parties, plan)
        if payment is not None:
            return payment
    return _charge_locking_first(parties, plan, consume_hold=consume_hold)


def _charge_locking_first(parties: Parties, plan: Charge, *, consume_hold: Hold | None) -> Payment:
    """Locks: see `charge`."""
    asset_code = plan.asset_code
    locked, accounts = _rows_lock(parties, plan)
    customer, merchant = accounts.customer, accounts.merchant
    assert customer is not None and merchant is not None  # _rows_lock raised NotFound otherwise
    # No balance row: an asset this tenant does not have, or a wallet that never held it.
    no_row = locked.row(account=customer, asset_code=asset_code) is None
    if no_row and not asset_exists(asset_code=asset_code):
        raise AssetUnknown(param="asset")
    if customer.frozen or merchant.frozen:
        raise WalletFrozen("the wallet is frozen", param=None)
    if no_row:
        raise InsufficientFunds("insufficient funds", param="amount")
    plan = _rewards_cut(locked, customer=customer, plan=plan)

    payment_id = ids.new_payment_id()
    legs = _legs(accounts, plan)
    txn = ledger_post(
        kind=LedgerTransactionKind.PAYMENT, reference=payment_id, legs=legs, locked=locked, created=plan.now, consume_hold=consume_hold
    )
    payment, event = _payment_rows_new(parties, plan, payment_id=payment_id, txn_id=txn.id)
    rows_insert([payment], [event])
    return payment


def _rows_lock(parties: Parties, plan: Charge) -> tuple[LockedBalances, MovementAccounts]:
    """Lock the charge's balance rows, finding its accounts in the same statement; with a
    row missing (a first reward or shard credit), the accounts are read and
    `balance_rows_lock` makes the rows that may be made."""
    wanted = _rows_wanted(parties, plan)
    locked = balance_rows_lock_by_owner(rows=wanted)
    if len(locked.rows) == len(wanted):
        return locked, _accounts_of(locked, parties)
    accounts = movement_accounts_get(customer_id=parties.customer_id, merchant_id=parties.merchant_id, system_roles=SYSTEM_ROLES)
    if accounts.merchant is None:
        raise NotFound("no such terminal or merchant", param="terminal")
    if accounts.customer is None:
        raise NotFound("no such customer", param="customer")
    return balance_rows_lock(wants=ledger_wants(_legs(accounts, plan))), accounts


class _NotPlain(Exception):
    """The locked rows cut a reward the plan did not, or do not bear out the remembered
    accounts: the payment is made locking first."""


def charge_write_first(parties: Parties, plan: Charge) -> Payment | None:
    """Write the ledger rows, the payment and its event in a savepoint, then lock the
    balance rows for `ledger_post`'s checks: a refusal rolls the savepoint back and raises;
    anything but the plain case (a reward cut since the plan, remembered accounts the locked
    rows do not bear out) rolls back and returns None, for the lock-first path.
    Locks: a savepoint; then the lock-first path's balance rows (balance_rows_lock)."""
    if not connection.in_atomic_block:
        return None  # no savepoint outside a transaction: the locking-first path refuses that
    known_key = (
        str(getattr(connection, "schema_name", "")), parties.customer_id, parties.merchant_id, plan.asset_code, plan.points > 0,
        plan.grams > 0, plan.fee > 0,
    )
    accounts = _KNOWN_ACCOUNTS.get(known_key)
    from_plan = accounts is None
    if accounts is None:
        accounts = _plan_accounts(parties, plan)
        if accounts is None:
            return None
    customer = accounts.customer
    assert customer is not None

    payment_id = ids.new_payment_id()
    legs = _legs(accounts, plan)
    txn, entries = ledger_rows_new(kind=LedgerTransactionKind.PAYMENT, reference=payment_id, legs=legs, created=plan.now)
    payment, event = _payment_rows_new(parties, plan, payment_id=payment_id, txn_id=txn.id)
    savepoint = rows_insert_in_savepoint([txn], entries, [payment], [event])  # a failure here rolled its rows back already
    try:
        wants = ledger_wants(legs)
        if from_plan:
            locked = balance_rows_lock(wants=wants)
        else:
            # Accounts from memory are checked on the locked rows, and make no row.
            locked = balance_rows_lock(wants=[replace(want, creatable=False) for want in wants])
            if not _accounts_hold(locked, accounts, parties, wants):
                raise _NotPlain()
        if _rewards_cut(locked, customer=customer, plan=plan) != plan:
            raise _NotPlain()
        ledger_post(kind=LedgerTransactionKind.PAYMENT, reference=payment_id, legs=legs, locked=locked, created=plan.now, written=txn)
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
        if isinstance(failure, _NotPlain):
            return None
        raise
    if from_plan:
        _known_accounts_remember(known_key, accounts)
    return payment


def _plan_accounts(parties: Parties, plan: Charge) -> MovementAccounts | None:
    """The payment's accounts, read without a lock, if it is the plain case: every row
    there, no frozen wallet, the funds there, no reward cut."""
    wanted = _rows_wanted(parties, plan)
    rows = balance_rows_read_by_owner(rows=wanted)
    if len(rows.rows) != len(wanted):
        return None
    accounts = _accounts_of(rows, parties)
    customer, merchant = accounts.customer, accounts.merchant
    if customer is None or merchant is None or customer.frozen or merchant.frozen:
        return None
    if available(locked=rows, account=customer, asset_code=plan.asset_code) < plan.amount:
        return None
    if _rewards_cut(rows, customer=customer, plan=plan) != plan:
        return None
    return accounts


# Accounts known from an earlier payment of the same parties, per process: only a hint
# that saves the plan read (a party's account ids never change). Under the lock, remembered
# accounts make no missing row and each locked row is checked to be the party's; any
# failure forgets the entry. A stale `frozen` can only say "not frozen": the rows override.

_KnownKey = tuple[str, str, str, str, bool, bool, bool]  # schema, customer, merchant, asset, points?, carbon?, fee?
_KNOWN_ACCOUNTS_MAX = 4_096  # about 2.5 KB an entry: ~10 MB a process at most
_KNOWN_ACCOUNTS: dict[_KnownKey, MovementAccounts] = {}


def _known_accounts_remember(key: _KnownKey, accounts: MovementAccounts) -> None:
    if len(_KNOWN_ACCOUNTS) >= _KNOWN_ACCOUNTS_MAX:
        _KNOWN_ACCOUNTS.clear()  # bounded; the busiest parties come back at their next payment
    _KNOWN_ACCOUNTS[key] = accounts


def known_accounts_forget() -> None:
    """Forget every remembered account (tests and benchmarks)."""
    _KNOWN_ACCOUNTS.clear()


def _accounts_hold(locked: LockedBalances, accounts: MovementAccounts, parties: Parties, wants: list[BalanceWant]) -> bool:
    """Every wanted row was locked, and each remembered account is, as read under the
    lock, still its party's."""
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


# --- What both strategies want and write (no lock, no read, no write here) ----------------------


def _rows_wanted(parties: Parties, plan: Charge) -> list[OwnerRow]:
    """The customer's rows, and this connection's shard of the merchant, fees and reward accounts."""
    shard, asset_code = connection_shard(), plan.asset_code
    customer_id = parties.customer_id
    wanted = [OwnerRow(AccountKind.CUSTOMER, customer_id, asset_code), OwnerRow(AccountKind.MERCHANT, parties.merchant_id, asset_code, shard)]
    if plan.fee:
        wanted += [OwnerRow(AccountKind.SYSTEM, SystemRole.FEES, asset_code, shard)]
    if plan.points:
        wanted += [OwnerRow(AccountKind.CUSTOMER, customer_id, POINTS_ASSET)]
        wanted += [OwnerRow(AccountKind.SYSTEM, SystemRole.BONUS_POOL, POINTS_ASSET, shard)]
    if plan.grams:
        wanted += [OwnerRow(AccountKind.CUSTOMER, customer_id, CARBON_ASSET)]
        wanted += [OwnerRow(AccountKind.SYSTEM, SystemRole.CARBON_REGISTRY, CARBON_ASSET, shard)]
    return wanted


def _accounts_of(rows: LockedBalances, parties: Parties) -> MovementAccounts:
    """The parties' accounts as read with their balance rows (None where a row is missing)."""
    system = {role: rows.account_of(kind=AccountKind.SYSTEM, owner=role) for role in SYSTEM_ROLES}
    return MovementAccounts(
        customer=rows.account_of(kind=AccountKind.CUSTOMER, owner=parties.customer_id),
        merchant=rows.account_of(kind=AccountKind.MERCHANT, owner=parties.merchant_id),
        system={role: account for role, account in system.items() if account is not None},
    )


def _rewards_cut(rows: LockedBalances, *, customer: Account, plan: Charge) -> Charge:
    """The plan with its rewards cut to what the customer's capped reward rows still have room for."""
    points, grams = plan.points, plan.grams
    points_room = cap_room(locked=rows, account=customer, asset_code=POINTS_ASSET) if points else None
    grams_room = cap_room(locked=rows, account=customer, asset_code=CARBON_ASSET) if grams else None
    cut = (points if points_room is None else min(points, points_room), grams if grams_room is None else min(grams, grams_room))
    return plan if cut == (points, grams) else replace(plan, points=cut[0], grams=cut[1])


def _legs(accounts: MovementAccounts, plan: Charge) -> list[Leg]:
    """Customer -> merchant (amount - fee) and fees account (fee), and the rewards from the
    system accounts to the customer. A zero side has no leg."""
    customer, merchant = accounts.customer, accounts.merchant
    assert customer is not None and merchant is not None
    asset_code, amount, fee, points, grams = plan.asset_code, plan.amount, plan.fee, plan.points, plan.grams
    legs = [Leg(customer, asset_code, -amount)]
    if amount > fee:
        legs += [Leg(merchant, asset_code, amount - fee)]
    if fee > 0:
        legs += [Leg(accounts.system_account(SystemRole.FEES), asset_code, fee)]
    if points > 0:
        legs += [Leg(customer, POINTS_ASSET, points), Leg(accounts.system_account(SystemRole.BONUS_POOL), POINTS_ASSET, -points)]
    if grams > 0:
        legs += [Leg(customer, CARBON_ASSET, grams), Leg(accounts.system_account(SystemRole.CARBON_REGISTRY), CARBON_ASSET, -grams)]
    return legs


def _payment_rows_new(parties: Parties, plan: Charge, *, payment_id: str, txn_id: str) -> tuple[Payment, OutboxEvent]:
    """The payment row and its `payment.succeeded` event, not yet saved."""
    asset_code, amount, fee, now = plan.asset_code, plan.amount, plan.fee, plan.now
    payment = Payment(
        id=payment_id,
        status=PaymentStatus.SUCCEEDED,
        customer_id=parties.customer_id,
        merchant_id=parties.merchant_id,
        store_id=parties.store_id,
        terminal_id=parties.terminal_id,
        asset_id=asset_code,
        amount=amount,
        fee=fee,
        points_earned=plan.points,
        carbon_grams=plan.grams,
        ledger_transaction_id=txn_id,
        created=now,
    )
    event = outbox_event_new(
        topic="payment.succeeded",
        payload={
            "id": payment_id, "object": "payment", "status": PaymentStatus.SUCCEEDED.value, "asset": asset_code, "amount": amount,
            "fee": fee, "net": amount - fee, "customer": parties.customer_id, "merchant": parties.merchant_id, "store": parties.store_id,
            "terminal": parties.terminal_id, "points_earned": plan.points, "carbon_grams": plan.grams, "created": epoch_seconds(now),
        },
        created=now,
        sequence=1,  # a new payment's first event
    )
    return payment, event
