"""Row locks on the payments app's rows, in the order of docs/ARCHITECTURE.md ("Locks and
their order"): one business row per movement before any balance row; gateway accounts and
PSP event markers alone. The recovery and schedule locks are session advisory locks, only tried."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from payments.models import GatewayAccount, Mandate, Payment, PaymentIntent, Payout, PendingAdjustment, PspWebhookEvent, TopUp
from wallets.locks import advisory_lock_try


def payment_lock(*, payment_id: str) -> Payment | None:
    """A payment row: a business row, before any balance row."""
    return Payment.objects.filter(pk=payment_id).order_by("pk").select_for_update().first()


def topup_lock(*, topup_id: str) -> TopUp | None:
    """A top-up row: a business row, before any balance row (after its idempotency record in a fenced completion)."""
    return TopUp.objects.filter(pk=topup_id).order_by("pk").select_for_update().first()


def payout_lock(*, payout_id: str) -> Payout | None:
    """A payout row: a business row, before any balance row."""
    return Payout.objects.filter(pk=payout_id).order_by("pk").select_for_update().first()


def payment_intent_lock(*, intent_id: str) -> PaymentIntent | None:
    """A payment intent row: a business row, before any balance row."""
    return PaymentIntent.objects.filter(pk=intent_id).order_by("pk").select_for_update().first()


def pending_adjustment_lock(*, pending_id: str) -> PendingAdjustment | None:
    """A pending adjustment row: a business row, before any balance row."""
    return PendingAdjustment.objects.filter(pk=pending_id).order_by("pk").select_for_update().first()


def mandate_lock(*, mandate_id: str) -> Mandate:
    """A mandate row (its revocation): a business row; no balance row is taken after it."""
    return Mandate.objects.select_for_update().get(pk=mandate_id)


def gateway_account_rows_lock() -> list[GatewayAccount]:
    """Every gateway account row of the tenant, in id order (switching the active one): taken alone."""
    return list(GatewayAccount.objects.select_for_update().order_by("pk"))


def psp_webhook_events_expired_lock(*, received_before: datetime, limit: int) -> list[int]:
    """Ids of the oldest PSP event markers received before `received_before`, SKIP LOCKED (the purge's batch): taken alone."""
    return list(
        PspWebhookEvent.objects.select_for_update(skip_locked=True).filter(received__lt=received_before)
        .order_by("received").values_list("pk", flat=True)[:limit]
    )


@contextmanager
def topup_recovery_lock() -> Iterator[bool]:
    """One top-up recovery pass per tenant at a time (a second would only ask the PSP the
    same questions). Yields whether it was taken."""
    with advisory_lock_try(name="tally.topup-recovery") as taken:
        yield taken


@contextmanager
def payout_recovery_lock() -> Iterator[bool]:
    """One payout recovery pass per tenant at a time. Yields whether it was taken."""
    with advisory_lock_try(name="tally.payout-recovery") as taken:
        yield taken


@contextmanager
def payout_schedule_lock() -> Iterator[bool]:
    """One scheduled-payouts run per tenant at a time. Yields whether it was taken."""
    with advisory_lock_try(name="tally.payout-schedule") as taken:
        yield taken
