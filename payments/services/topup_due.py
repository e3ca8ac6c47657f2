"""The top-up recovery's due-work row (tenants.duework): marked by the claim that commits
a pending card top-up, due when its lease ends (the recovery may then have to take it
over); settled by each recovery pass to when the next one is due."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from idempotency.selectors import idempotency_external_lease_next_end
from payments.selectors import topups_recovery_next_due_at
from tenants.duework import due_work_mark, due_work_settle
from tenants.models import DueWorkKind


def topup_due_mark() -> None:
    """In the claim's transaction: the recovery has a look once this top-up's lease ends.
    Locks: the tenant's top-up due-work lock, SHARED (tenants.duework)."""
    due_work_mark(kind=DueWorkKind.TOPUPS, due_at=timezone.now() + timedelta(seconds=int(settings.TALLY_TOPUP_LEASE_SECONDS)))


def topup_recovery_due_now() -> None:
    """In the caller's transaction: the recovery has work in this tenant at once (a card
    refund owed, or an operator-queue change its gauges must show). A row already there is
    left alone; it is due by the end of a lease at the latest.
    Locks: the tenant's top-up due-work lock, SHARED (tenants.duework)."""
    due_work_mark(kind=DueWorkKind.TOPUPS, due_at=timezone.now())


def _next_due() -> datetime | None:
    # Records before top-ups: a completion settles both in one transaction.
    now = timezone.now()
    dues = [
        idempotency_external_lease_next_end(),
        topups_recovery_next_due_at(lease_seconds=int(settings.TALLY_TOPUP_LEASE_SECONDS), now=now),
    ]
    return min((d for d in dues if d is not None), default=None)


def topup_due_settle() -> bool:
    """After a recovery pass: the row says when the recovery next has work, or goes.
    Locks: the tenant's top-up due-work lock, EXCLUSIVE, tried (tenants.duework)."""
    return due_work_settle(kind=DueWorkKind.TOPUPS, next_due=_next_due)
