"""Card top-ups: money entering a wallet from PSP funding, plus the tenant's top-up bonus
(`topup_bonus_rate`, ROUND_FLOOR) from the bonus pool."""

from __future__ import annotations

from payments.locks import topup_lock
from payments.models import TopUp, TopUpStatus
from payments.services.outbox import outbox_event_create
from tenants.selectors import tenant_current, tenant_rate
from wallets.errors import CapExceeded, InvalidRequest, InvalidState, NotFound, WalletFrozen
from wallets.models import Customer, LedgerTransactionKind, SystemRole
from wallets.money import amount_to_minor, topup_bonus_for
from wallets.selectors import account_balance, account_of, asset_get, movement_accounts_get
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service


@atomic_service(operation="topup_create")
def topup_create(*, customer: Customer, asset_code: str, amount: object, payment_method: str) -> TopUp:
    """Record a card top-up as `pending` (the PSP is charged later, then topup_credit runs).

    Refuses early what the credit would refuse: frozen wallet, or the cap (amount + bonus).
    Locks: none (the credit locks and checks again).
    """
    minor = amount_to_minor(amount)
    if not isinstance(payment_method, str) or not payment_method.strip():
        raise InvalidRequest("payment_method is required", param="payment_method")
    asset = asset_get(asset_code=asset_code)
    account = account_of(party=customer)
    if account.frozen:
        raise WalletFrozen("the wallet is frozen", param=None)
    bonus = topup_bonus_for(amount=minor, rate=tenant_rate(tenant_current(), "topup_bonus_rate"))
    if asset.cap is not None:
        balance, _ = account_balance(account=account, asset_code=asset.code)
        if balance + minor + bonus > asset.cap:
            raise CapExceeded(f"the wallet's {asset.code} balance would exceed its cap of {asset.cap}", param="amount")
    topup = TopUp.objects.create(customer=customer, asset=asset, amount=minor, bonus_amount=bonus, payment_method=payment_method[:100])
    outbox_event_create(
        topic="topup.created",
        payload={"id": topup.id, "object": "topup", "customer": customer.pk, "asset": asset.code, "amount": minor, "status": topup.status},
    )
    return topup


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
    """Credit a pending top-up from PSP funding, plus its bonus from the bonus pool.

    Idempotent: a top-up already credited is returned unchanged. The cap is enforced on
    amount + bonus atomically (CapExceeded; the caller then refunds the card).
    Locks: the top-up row, then the balance rows (ledger_post).
    """
    result = _topup_credit(topup_id=topup.pk)
    topup.status, topup.ledger_transaction_id = result.status, result.ledger_transaction_id
    return result


@atomic_service(operation="topup_fail")
def topup_fail(*, topup: TopUp, failure_code: str) -> TopUp:
    """Mark a pending top-up failed (the PSP declined). Locks: the top-up row."""
    locked = topup_lock(topup_id=topup.pk)
    if locked is None:
        raise NotFound("no such top-up", param="topup")
    if locked.status != TopUpStatus.PENDING:
        raise InvalidState(f"top-up is {locked.status}", param=None)
    locked.status, locked.failure_code = TopUpStatus.FAILED, failure_code[:50]
    locked.save(update_fields=["status", "failure_code", "updated"])
    outbox_event_create(topic="topup.failed", payload={"id": locked.id, "object": "topup", "failure_code": locked.failure_code})
    return locked
