"""Charges: a customer paying a merchant, at a terminal (by customer id or scanned QR
token) or through a payment intent. Lock first, in the caller's transaction.atomic block:
every balance row in one `select_for_update` statement (wallets.locks, in the global lock
order), refusals and reward cuts decided on the locked rows, then the ledger and the
balances with F() updates (`ledger_post`), the payment and its outbox row. The usual
payment first tries the measured write-first variant (charges_write_first).

Rewards, in the tenant's main currency only: points at `points_earn_rate` (ROUND_FLOOR)
from the bonus pool, carbon at `carbon_grams_per_unit` (ROUND_HALF_EVEN) from the carbon
registry, each cut to what fits under its asset's cap.
"""

from __future__ import annotations

from django.utils import timezone

from payments.models import Payment
from payments.services.charge_rows import (
    REWARD_SYSTEM_ROLES,
    Parties,
    charge_accounts_of,
    charge_legs,
    charge_rows_wanted,
    payment_rows_new,
    rewards_cut,
)
from payments.services.charges_write_first import charge_write_first
from payments.services.mandates import charge_by_customer_id_check
from payments.services.tokens import payment_token_consume
from tenants.selectors import tenant_current, tenant_rate
from wallets import ids
from wallets.errors import AssetUnknown, InsufficientFunds, NotFound, WalletFrozen
from wallets.locks import LockedBalances, balance_rows_lock, balance_rows_lock_by_owner, rows_insert
from wallets.models import Customer, Hold, LedgerTransactionKind, Terminal
from wallets.money import amount_to_minor, carbon_grams_for, points_for
from wallets.selectors import MovementAccounts, asset_exists, movement_accounts_get
from wallets.services.ledger import ledger_post, ledger_wants
from wallets.transactions import atomic_service


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
    """Customer -> merchant, in the caller's transaction; a refusal leaves nothing written.
    `consume_hold`: a hold (locked by the caller) this charge captures (ledger_post).

    Locks: the customer's balance rows (asset, POINT, CARBON), the merchant's shard and
    the bonus pool's and carbon registry's shards, in one statement in the global order
    (wallets.locks), before anything is written. `charge_write_first` takes the same locks
    after writing its rows in a savepoint. Refusals, in this order: NotFound (terminal or
    merchant, then customer), AssetUnknown, WalletFrozen, InsufficientFunds.
    """
    tenant = tenant_current()
    rewarded = asset_code == tenant.main_currency
    points = points_for(amount=amount, rate=tenant_rate(tenant, "points_earn_rate")) if rewarded else 0
    grams = carbon_grams_for(amount=amount, grams_per_unit=tenant_rate(tenant, "carbon_grams_per_unit")) if rewarded else 0
    parties = Parties(customer_id=customer_id, merchant_id=merchant_id, store_id=store_id, terminal_id=terminal_id)
    if consume_hold is None:
        payment = charge_write_first(parties, asset_code=asset_code, amount=amount, points=points, grams=grams)
        if payment is not None:
            return payment
    return _charge_locking_first(parties, asset_code=asset_code, amount=amount, points=points, grams=grams, consume_hold=consume_hold)


def _charge_locking_first(
    parties: Parties, *, asset_code: str, amount: int, points: int, grams: int, consume_hold: Hold | None
) -> Payment:
    """Locks: see `charge`."""
    locked, accounts = _rows_lock(parties, asset_code=asset_code, points=points, grams=grams)
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
    points, grams = rewards_cut(locked, customer=customer, points=points, grams=grams)

    now = timezone.now()
    payment_id = ids.new_payment_id()
    legs = charge_legs(accounts, asset_code=asset_code, amount=amount, points=points, grams=grams)
    txn = ledger_post(kind=LedgerTransactionKind.PAYMENT, reference=payment_id, legs=legs, locked=locked, created=now, consume_hold=consume_hold)
    payment, event = payment_rows_new(
        parties, payment_id=payment_id, txn_id=txn.id, asset_code=asset_code, amount=amount, points=points, grams=grams, now=now
    )
    rows_insert([payment], [event])
    return payment


def _rows_lock(parties: Parties, *, asset_code: str, points: int, grams: int) -> tuple[LockedBalances, MovementAccounts]:
    """Lock the charge's balance rows, finding its accounts in the same statement. When a
    row is missing (a first reward or shard credit, an empty wallet), the accounts are read
    and `balance_rows_lock` makes the rows that may be made."""
    wanted = charge_rows_wanted(parties, asset_code=asset_code, points=points, grams=grams)
    locked = balance_rows_lock_by_owner(rows=wanted)
    if len(locked.rows) == len(wanted):
        return locked, charge_accounts_of(locked, parties)
    accounts = movement_accounts_get(customer_id=parties.customer_id, merchant_id=parties.merchant_id, system_roles=REWARD_SYSTEM_ROLES)
    if accounts.merchant is None:
        raise NotFound("no such terminal or merchant", param="terminal")
    if accounts.customer is None:
        raise NotFound("no such customer", param="customer")
    legs = charge_legs(accounts, asset_code=asset_code, amount=1, points=points, grams=grams)  # only the signs matter here
    return balance_rows_lock(wants=ledger_wants(legs)), accounts


def _asset_code_check(asset_code: object) -> str:
    if not isinstance(asset_code, str) or not asset_code:
        raise AssetUnknown(param="asset")
    return asset_code


def _terminal_charge(*, terminal: Terminal, customer_id: str, asset_code: str, amount: int) -> Payment:
    return charge(
        customer_id=customer_id, merchant_id=terminal.store.merchant_id, store_id=terminal.store_id, terminal_id=terminal.pk,
        asset_code=asset_code, amount=amount,
    )


@atomic_service(operation="payment_create")
def payment_create(
    *, terminal: Terminal, customer: Customer | None = None, customer_id: str | None = None, asset_code: object, amount: object
) -> Payment:
    """Take a payment from `customer` (or its `customer_id`) at `terminal`. Charging by
    customer id needs the tenant's `charge_by_customer_id` or a mandate
    (ChargeByCustomerIdNotPermitted, checked first). Locks: see `charge`."""
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
