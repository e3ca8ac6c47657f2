"""What the lock-first and write-first charges share: the rows a charge wants, its
accounts, legs, rewards cut to their caps, and its payment and event rows. Nothing here
locks, reads a table or writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from payments.models import OutboxEvent, Payment, PaymentStatus
from payments.services.outbox import epoch_seconds, outbox_event_new
from wallets.locks import LockedBalances, OwnerRow, connection_shard
from wallets.models import CARBON_ASSET, POINTS_ASSET, Account, AccountKind, SystemRole
from wallets.selectors import MovementAccounts
from wallets.services.ledger import Leg, cap_room

REWARD_SYSTEM_ROLES = (SystemRole.BONUS_POOL, SystemRole.CARBON_REGISTRY)


@dataclass(frozen=True)
class Parties:
    customer_id: str
    merchant_id: str
    store_id: str | None
    terminal_id: str | None


def rewards_cut(rows: LockedBalances, *, customer: Account, points: int, grams: int) -> tuple[int, int]:
    """The rewards cut to what the customer's capped reward rows still have room for."""
    points_room = cap_room(locked=rows, account=customer, asset_code=POINTS_ASSET) if points else None
    grams_room = cap_room(locked=rows, account=customer, asset_code=CARBON_ASSET) if grams else None
    return (points if points_room is None else min(points, points_room), grams if grams_room is None else min(grams, grams_room))


def payment_rows_new(
    parties: Parties, *, payment_id: str, txn_id: str, asset_code: str, amount: int, points: int, grams: int, now: datetime
) -> tuple[Payment, OutboxEvent]:
    """The payment row and its `payment.succeeded` event, not yet saved."""
    payment = Payment(
        id=payment_id,
        status=PaymentStatus.SUCCEEDED,
        customer_id=parties.customer_id,
        merchant_id=parties.merchant_id,
        store_id=parties.store_id,
        terminal_id=parties.terminal_id,
        asset_id=asset_code,
        amount=amount,
        points_earned=points,
        carbon_grams=grams,
        ledger_transaction_id=txn_id,
        created=now,
    )
    event = outbox_event_new(
        topic="payment.succeeded",
        payload={
            "id": payment_id, "object": "payment", "status": PaymentStatus.SUCCEEDED.value, "asset": asset_code, "amount": amount,
            "customer": parties.customer_id, "merchant": parties.merchant_id, "store": parties.store_id, "terminal": parties.terminal_id,
            "points_earned": points, "carbon_grams": grams, "created": epoch_seconds(now),
        },
        created=now,
        sequence=1,  # a new payment's first event
    )
    return payment, event


def charge_rows_wanted(parties: Parties, *, asset_code: str, points: int, grams: int) -> list[OwnerRow]:
    """The customer's rows, and this connection's shard of the merchant and reward accounts."""
    shard = connection_shard()
    customer_id = parties.customer_id
    wanted = [OwnerRow(AccountKind.CUSTOMER, customer_id, asset_code), OwnerRow(AccountKind.MERCHANT, parties.merchant_id, asset_code, shard)]
    if points:
        wanted += [OwnerRow(AccountKind.CUSTOMER, customer_id, POINTS_ASSET)]
        wanted += [OwnerRow(AccountKind.SYSTEM, SystemRole.BONUS_POOL, POINTS_ASSET, shard)]
    if grams:
        wanted += [OwnerRow(AccountKind.CUSTOMER, customer_id, CARBON_ASSET)]
        wanted += [OwnerRow(AccountKind.SYSTEM, SystemRole.CARBON_REGISTRY, CARBON_ASSET, shard)]
    return wanted


def charge_accounts_of(rows: LockedBalances, parties: Parties) -> MovementAccounts:
    """The parties' accounts as read with their balance rows (None where a row is missing)."""
    system = {role: rows.account_of(kind=AccountKind.SYSTEM, owner=role) for role in REWARD_SYSTEM_ROLES}
    return MovementAccounts(
        customer=rows.account_of(kind=AccountKind.CUSTOMER, owner=parties.customer_id),
        merchant=rows.account_of(kind=AccountKind.MERCHANT, owner=parties.merchant_id),
        system={role: account for role, account in system.items() if account is not None},
    )


def charge_legs(accounts: MovementAccounts, *, asset_code: str, amount: int, points: int, grams: int) -> list[Leg]:
    """Customer -> merchant, and the rewards from the system accounts to the customer."""
    customer, merchant = accounts.customer, accounts.merchant
    assert customer is not None and merchant is not None
    legs = [Leg(customer, asset_code, -amount), Leg(merchant, asset_code, amount)]
    if points > 0:
        legs += [Leg(customer, POINTS_ASSET, points), Leg(accounts.system_account(SystemRole.BONUS_POOL), POINTS_ASSET, -points)]
    if grams > 0:
        legs += [Leg(customer, CARBON_ASSET, grams), Leg(accounts.system_account(SystemRole.CARBON_REGISTRY), CARBON_ASSET, -grams)]
    return legs
