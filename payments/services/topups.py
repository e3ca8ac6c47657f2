"""Top-ups: money entering a wallet from PSP funding, plus the tenant's top-up bonus
(`topup_bonus_rate`, ROUND_FLOOR) from the bonus pool."""

from __future__ import annotations

from payments.locks import topup_lock
from payments.models import TopUp, TopUpStatus
from payments.services.outbox import outbox_event_create
from tenants.selectors import tenant_current, tenant_rate
from wallets.errors import BusinessRefusal, CapExceeded, InvalidRequest, InvalidState, NotFound, WalletFrozen
from wallets.models import Asset, Customer, LedgerTransactionKind, SystemRole
from wallets.money import amount_to_minor, topup_bonus_for
from wallets.selectors import account_balance, account_of, asset_get, movement_accounts_get
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service


def topup_pending_new(*, customer: Customer, asset: Asset, amount: int, payment_method: object, **fields: str) -> TopUp:
    """A pending top-up with the tenant's bonus, not yet saved (`fields`: its id, and the
    saga's columns). Locks: none."""
    if not isinstance(payment_method, str) or not payment_method.strip():
        raise InvalidRequest("payment_method is required", param="payment_method")
    bonus = topup_bonus_for(amount=amount, rate=tenant_rate(tenant_current(), "topup_bonus_rate"))
    return TopUp(customer=customer, asset=asset, amount=amount, bonus_amount=bonus, payment_method=payment_method[:100], **fields)


def topup_pending_save(*, topup: TopUp) -> TopUp:
    """Insert a pending top-up and its `topup.created` event. Locks: none (a new row)."""
    topup.save(force_insert=True)
    outbox_event_create(
        topic="topup.created",
        payload={
            "id": topup.id, "object": "topup", "customer": topup.customer_id, "asset": topup.asset_id, "amount": topup.amount,
            "status": topup.status,
        },
    )
    return topup


def topup_refusal_check(*, topup: TopUp) -> BusinessRefusal | None:
    """Would the credit be refused (frozen wallet, cap on amount + bonus)? A read; the
    credit checks again under its locks."""
    account = account_of(party=topup.customer)
    if account.frozen:
        return WalletFrozen("the wallet is frozen", param=None)
    asset = asset_get(asset_code=topup.asset_id)
    if asset.cap is not None:
        balance, _ = account_balance(account=account, asset_code=asset.code)
        if balance + topup.amount + topup.bonus_amount > asset.cap:
            return CapExceeded(f"the wallet's {asset.code} balance would exceed its cap of {asset.cap}", param="amount")
    return None


@atomic_service(operation="topup_create")
def topup_create(*, customer: Customer, asset_code: str, amount: object, payment_method: str) -> TopUp:
    """Record a top-up as `pending`, refusing early what the credit would refuse (frozen
    wallet, the cap on amount + bonus). Locks: none (the credit locks and checks again)."""
    minor = amount_to_minor(amount)
    topup = topup_pending_new(customer=customer, asset=asset_get(asset_code=asset_code), amount=minor, payment_method=payment_method)
    refusal = topup_refusal_check(topup=topup)
    if refusal is not None:
        raise refusal
    return topup_pending_save(topup=topup)


@atomic_service(operation="topup_credit")
def _topup_credit(*, topup_id: str) -> TopUp:
    locked = topup_lock(topup_id=topup_id)
    if locked is None:
        raise NotFound("no such top-up", param="topup")
    if locked.status == TopUpStatus.SUCCEEDED:
        return locked
    if locked.status != TopUpStatus.PENDING:
        raise InvalidState(f"top-up is {locked.status}", param=None)
    accounts = movement_accounts_get(customer_id=locked.customer_id, merchant_id=None, system_roles=(SystemRole.PSP_FUNDING, SystemRole.BONUS_POOL))
    account = accounts.customer
    assert account is not None
    legs = [Leg(accounts.system_account(SystemRole.PSP_FUNDING), locked.asset_id, -locked.amount), Leg(account, locked.asset_id, locked.amount)]
    if locked.bonus_amount > 0:
        legs += [
            Leg(accounts.system_account(SystemRole.BONUS_POOL), locked.asset_id, -locked.bonus_amount),
            Leg(account, locked.asset_id, locked.bonus_amount),
        ]
    txn = ledger_post(kind=LedgerTransactionKind.TOPUP, reference=locked.id, legs=legs)
    locked.status = TopUpStatus.SUCCEEDED
    locked.ledger_transaction = txn
    locked.save(update_fields=["status", "ledger_transaction", "updated"])
    outbox_event_create(
        topic="topup.succeeded",
        payload={
            "id": locked.id, "object": "topup", "customer": locked.customer_id, "asset": locked.asset_id,
            "amount": locked.amount, "bonus_amount": locked.bonus_amount, "status": locked.status,
        },
    )
    return locked


def topup_credit(*, topup: TopUp) -> TopUp:
    """Credit a pending top-up from PSP funding, plus its bonus from the bonus pool, once
    (CapExceeded on amount + bonus). Locks: the top-up row, then the balance rows."""
    result = _topup_credit(topup_id=topup.pk)
    topup.status, topup.ledger_transaction_id = result.status, result.ledger_transaction_id
    return result
