"""The recovery's due-work row (tenants.duework; docs/ARCHITECTURE.md, "Beat, due work"): one
row of kind `topups` per tenant for both PSP sagas, card top-ups and payouts (payout_saga.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from idempotency.selectors import idempotency_external_lease_next_end
from payments.selectors import payouts_recovery_next_due_at, topups_recovery_next_due_at
from tenants.duework import due_work_mark, due_work_settle
from tenants.models import DueWorkKind


def topup_due_mark() -> None:
    """In the claim's transaction: the recovery has a look once this top-up's lease ends.
    Locks: the tenant's top-up due-work lock, SHARED."""
    due_work_mark(kind=DueWorkKind.TOPUPS, due_at=timezone.now() + timedelta(seconds=int(settings.TALLY_TOPUP_LEASE_SECONDS)))


def topup_recovery_due_now() -> None:
    """In the caller's transaction: the recovery has work at once (a card refund owed, an
    operator-queue change for its gauges); a row already there, due by a lease's end at the
    latest, is left alone. Locks: the tenant's top-up due-work lock, SHARED."""
    due_work_mark(kind=DueWorkKind.TOPUPS, due_at=timezone.now())


def _next_due() -> datetime | None:
    # Records before top-ups: a completion settles both in one transaction.
    now = timezone.now()
    dues = [
        idempotency_external_lease_next_end(),
        topups_recovery_next_due_at(lease_seconds=int(settings.TALLY_TOPUP_LEASE_SECONDS), now=now),
        payouts_recovery_next_due_at(
            lease_seconds=int(settings.TALLY_PAYOUT_LEASE_SECONDS), check_every=timedelta(seconds=int(settings.TALLY_PAYOUT_CHECK_SECONDS)),
            now=now,
        ),
    ]
    return min((d for d in dues if d is not None), default=None)


def topup_due_settle() -> bool:
    """After a recovery pass: the row says when the recovery next has work, or goes.
    Locks: the tenant's top-up due-work lock, EXCLUSIVE, tried."""
    return due_work_settle(kind=DueWorkKind.TOPUPS, next_due=_next_due)
