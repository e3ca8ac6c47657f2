"""Wallet freezes by staff: every movement but a staff adjustment is refused (WalletFrozen)."""

from __future__ import annotations

from django.utils import timezone

from payments.services.outbox import outbox_event_create
from wallets.errors import InvalidRequest
from wallets.locks import account_balance_rows_lock, account_lock
from wallets.models import Account, Balance, Customer, StaffMember
from wallets.selectors import account_of
from wallets.services.audit import audit_record
from wallets.transactions import atomic_service


@atomic_service(operation="wallet_freeze_set")
def _freeze_set(*, customer: Customer, staff: StaffMember, reason: str, frozen: bool) -> Account:
    account_id = account_of(party=customer).pk
    # The balance rows first (a hold's insert takes a key-share lock on the account row
    # while holding its balance row), then the account. The rows carry the flag too, under
    # their locks: a posting checks it on the rows it holds, so one that was waiting for
    # them when this commits is refused.
    rows = account_balance_rows_lock(account_id=account_id)
    account = account_lock(account_id=account_id)
    before = _freeze_state(account)
    Balance.objects.filter(pk__in=[row.pk for row in rows]).update(frozen=frozen)
    account.frozen = frozen
    account.frozen_reason = reason[:500] if frozen else ""
    account.frozen_at = timezone.now() if frozen else None
    account.save(update_fields=["frozen", "frozen_reason", "frozen_at"])
    audit_record(
        action="wallet.freeze" if frozen else "wallet.unfreeze", target_type="customer", target_id=customer.pk,
        before=before, after=_freeze_state(account), reason=reason,
    )
    outbox_event_create(
        topic="wallet.frozen" if frozen else "wallet.unfrozen",
        payload={"object": "wallet", "customer": customer.pk, "staff": staff.pk, "reason": reason[:500]},
    )
    return account


def _freeze_state(account: Account) -> dict[str, object]:
    return {"frozen": account.frozen, "frozen_reason": account.frozen_reason, "frozen_at": account.frozen_at}


def wallet_freeze(*, customer: Customer, staff: StaffMember, reason: str) -> Account:
    """Freeze a customer's wallet. Locks: all its balance rows, then the account row."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("a reason is required", param="reason")
    return _freeze_set(customer=customer, staff=staff, reason=reason, frozen=True)


def wallet_unfreeze(*, customer: Customer, staff: StaffMember, reason: str = "") -> Account:
    """Lift a freeze. Locks: all its balance rows, then the account row."""
    return _freeze_set(customer=customer, staff=staff, reason=str(reason), frozen=False)
