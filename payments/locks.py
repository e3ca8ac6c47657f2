"""Row locks on the payments app's business rows. Lock order (wallets/locks.py): these
come first, before any balance row; one business row per movement.

`topup_recovery_lock` is no row lock: a session advisory lock per tenant, tried (never
waited for) and held for a whole top-up recovery pass, while the pass takes the row locks
above one short transaction at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from payments.models import Payment, PaymentIntent, PendingAdjustment, TopUp
from wallets.locks import advisory_lock_try


def payment_lock(*, payment_id: str) -> Payment | None:
    return Payment.objects.filter(pk=payment_id).order_by("pk").select_for_update().first()


def topup_lock(*, topup_id: str) -> TopUp | None:
    return TopUp.objects.filter(pk=topup_id).order_by("pk").select_for_update().first()


def payment_intent_lock(*, intent_id: str) -> PaymentIntent | None:
    return PaymentIntent.objects.filter(pk=intent_id).order_by("pk").select_for_update().first()


def pending_adjustment_lock(*, pending_id: str) -> PendingAdjustment | None:
    return PendingAdjustment.objects.filter(pk=pending_id).order_by("pk").select_for_update().first()


@contextmanager
def topup_recovery_lock() -> Iterator[bool]:
    """One top-up recovery pass per tenant at a time: a pass reads every pending top-up,
    so one started by the next beat while another is still at the PSP would only ask the
    same questions twice. Yields whether it was taken (wallets.locks.advisory_lock_try)."""
    with advisory_lock_try(name="tally.topup-recovery") as taken:
        yield taken
