"""Row locks on the payments app's business rows. Lock order (wallets/locks.py): these
come first, before any balance row; one business row per movement."""

from __future__ import annotations

from payments.models import Payment, PaymentIntent, PendingAdjustment, TopUp


def payment_lock(*, payment_id: str) -> Payment | None:
    return Payment.objects.filter(pk=payment_id).order_by("pk").select_for_update().first()


def topup_lock(*, topup_id: str) -> TopUp | None:
    return TopUp.objects.filter(pk=topup_id).order_by("pk").select_for_update().first()


def payment_intent_lock(*, intent_id: str) -> PaymentIntent | None:
    return PaymentIntent.objects.filter(pk=intent_id).order_by("pk").select_for_update().first()


def pending_adjustment_lock(*, pending_id: str) -> PendingAdjustment | None:
    return PendingAdjustment.objects.filter(pk=pending_id).order_by("pk").select_for_update().first()
