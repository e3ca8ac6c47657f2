"""The operator queue of card top-ups: pending top-ups the recovery may no longer ask the
PSP about (past its idempotency-key window, where asking again could charge twice), held
by `card_topups.topup_review_hold`. A staff member looks the top-up up at the PSP (its id
is the PSP's idempotency key and the charge's `tally_topup` metadata) and settles it with
one of these, from the back office (payments/admin.py; permission `payments.settle_topup`,
each action audited). Only a top-up still pending in the queue can be settled here: any
other is being settled by the saga, a webhook or the recovery."""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from payments.gateways.base import ChargeResult
from payments.locks import topup_lock
from payments.models import TopUp, TopUpStatus
from payments.services.card_topups import topup_fail, topup_settle
from wallets.errors import BusinessRefusal, InvalidRequest, InvalidState, NotFound
from wallets.money import amount_to_minor
from wallets.transactions import atomic_service

logger = logging.getLogger("tally.topups")


def _queued(topup_id: str) -> TopUp:
    topup = topup_lock(topup_id=topup_id)
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    if topup.status != TopUpStatus.PENDING or topup.operator_review_at is None:
        raise InvalidState(f"top-up {topup.pk} is {topup.status} and not waiting for an operator", param=None)
    return topup


@atomic_service(operation="topup_review_settle_uncharged")
def topup_review_settle_uncharged(*, topup_id: str, reason: str) -> TopUp:
    """The PSP holds no successful charge for this top-up: it fails as `not_charged` (the
    customer's answer is a `psp_refused`). Should a charge surface later after all (a late
    webhook), it is recorded and refunded like any charge of a failed top-up.
    Locks: the top-up row."""
    topup = _queued(topup_id)
    logger.warning("queued top-up failed by an operator: not charged", extra={"topup": topup.pk, "reason": reason})
    return topup_fail(topup=topup, failure_code="not_charged")


@atomic_service(operation="topup_review_settle_charged")
def topup_review_settle_charged(
    *, topup_id: str, psp_reference: str, amount: object, charged_at: datetime | None = None, reason: str = ""
) -> tuple[TopUp, BusinessRefusal | None]:
    """The PSP holds the successful charge `psp_reference` of `amount` for this top-up:
    record it and credit the wallet (amount + bonus) as the saga would have. `amount` is
    what the PSP shows, typed by the operator: it must be the top-up's, and the reference
    no other top-up's, so a mistyped or reused charge credits nothing. `charged_at` is the
    PSP's charge time (settlement day; the top-up's creation when not given). If the credit
    is refused now (cap, frozen wallet), the top-up fails and the card is refunded by the
    recovery. Returns the top-up and that refusal, if any. Locks: the top-up row, then the
    balance rows (`topup_settle`)."""
    reference = psp_reference.strip() if isinstance(psp_reference, str) else ""
    if not reference:
        raise InvalidRequest("the PSP's reference of the charge is required", param="psp_reference")
    minor = amount_to_minor(amount)
    topup = _queued(topup_id)
    if minor != topup.amount:
        raise InvalidRequest(
            f"the PSP's charge is for {minor}, the top-up for {topup.amount}: that is not this top-up's charge", param="amount"
        )
    if TopUp.objects.filter(psp_reference=reference).exclude(pk=topup.pk).exists():
        raise InvalidRequest(f"the charge {reference} is already recorded on another top-up", param="psp_reference")
    if charged_at is not None and charged_at > timezone.now():
        raise InvalidRequest("the charge time is in the future", param="charged_at")
    result = ChargeResult(
        status="succeeded", psp_reference=reference, amount=topup.amount, currency=topup.asset_id, created=charged_at or topup.created
    )
    logger.warning("queued top-up settled by an operator: charged", extra={"topup": topup.pk, "psp_reference": reference, "reason": reason})
    return topup_settle(topup_id=topup.pk, result=result)

