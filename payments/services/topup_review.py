"""The operator queue of card top-ups (`topups.topup_review_hold`), settled by what the PSP
holds under the top-up's id (asked before the settlement's transaction: PspUnavailable when
it does not answer), never by what a person typed."""

from __future__ import annotations

import logging

from payments.errors import PspUnavailable
from payments.gateways.base import ChargeResult, GatewayError
from payments.gateways.registry import gateway_build
from payments.locks import topup_lock
from payments.models import TopUp, TopUpStatus
from payments.selectors import gateway_account_get, topup_get
from payments.services.topup_due import topup_recovery_due_now
from payments.services.topups import CHARGE_REFUNDED_CODE, topup_charge_matches, topup_fail, topup_fail_refunding, topup_settle
from wallets.errors import BusinessRefusal, InvalidState, NotFound
from wallets.transactions import run_atomic

logger = logging.getLogger("tally.topups")


def _queued(topup: TopUp | None) -> TopUp:
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    if topup.status != TopUpStatus.PENDING or topup.operator_review_at is None:
        raise InvalidState(f"top-up {topup.pk} is {topup.status} and not waiting for an operator", param=None)
    return topup


def _psp_charges(queued: TopUp) -> list[ChargeResult]:
    """The successful charges the PSP holds under the top-up's id. Raises PspUnavailable."""
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=queued.gateway))
        charges = gateway.charges_of(reference=queued.pk)
    except (GatewayError, NotFound) as exc:
        raise PspUnavailable("the card processor did not tell what it holds for this top-up: try again later") from exc
    succeeded = [c for c in charges if c.status == "succeeded"]
    if len(succeeded) > 1:
        raise InvalidState(f"the PSP holds {len(succeeded)} successful charges for {queued.pk}: refund the extra ones there first")
    return succeeded


def topup_review_fail_refunding(*, topup_id: str, reason: str) -> TopUp:
    """Fail a queued top-up as `charge_refunded`, recording the PSP's one successful charge
    under its id with the PSP's own figures, for the recovery to refund exactly that: the
    way out of the queue for a charge `topup_review_settle` refuses. No charge: refused.
    Locks: the top-up row, then the tenant's top-up due-work lock (SHARED)."""
    queued = _queued(topup_get(topup_id=topup_id))
    succeeded = _psp_charges(queued)
    if not succeeded:
        raise InvalidState(f"the PSP holds no successful charge for {queued.pk}: nothing to refund, settle it instead")
    charge = succeeded[0]
    logger.warning(
        "queued top-up failed by an operator; the PSP's charge is refunded",
        extra={"topup": queued.pk, "psp_reference": charge.psp_reference, "psp_amount": charge.amount, "reason": reason},
    )

    def fail() -> TopUp:
        topup = _queued(topup_lock(topup_id=topup_id))
        topup_recovery_due_now()  # the refund is owed now, and the queue shrinks
        return topup_fail_refunding(topup=topup, result=charge, failure_code=CHARGE_REFUNDED_CODE)

    return run_atomic(fail, operation="topup_review_fail_refunding")


def topup_review_settle(*, topup_id: str, reason: str) -> tuple[TopUp, BusinessRefusal | None]:
    """Settle a queued top-up by what its PSP holds: one matching successful charge is
    credited (as `topup_settle`); none fails it as `not_charged`; more than one, or one that
    does not match, settles nothing (a person sorts it out, or `topup_review_fail_refunding`).
    The admin runs this inside its idempotency claim's transaction, so the PSP read holds the
    claim row for up to the PSP timeout. Locks: the top-up row, the tenant's top-up due-work
    lock (SHARED), then (when credited) the balance rows."""
    queued = _queued(topup_get(topup_id=topup_id))
    succeeded = _psp_charges(queued)
    if succeeded and not topup_charge_matches(topup=queued, result=succeeded[0]):
        raise InvalidState(
            f"the PSP's charge {succeeded[0].psp_reference} does not match the top-up's amount and currency:"
            " fail it and refund the charge instead"
        )
    logger.warning(
        "queued top-up settled by an operator from the PSP's records",
        extra={"topup": queued.pk, "psp_reference": succeeded[0].psp_reference if succeeded else "", "reason": reason},
    )
    return run_atomic(lambda: _settle(queued.pk, succeeded[0] if succeeded else None), operation="topup_review_settle")


def _settle(topup_id: str, charge: ChargeResult | None) -> tuple[TopUp, BusinessRefusal | None]:
    topup = _queued(topup_lock(topup_id=topup_id))
    topup_recovery_due_now()  # the queue shrinks: the next pass shows it in the gauges
    if charge is None:
        return topup_fail(topup=topup, failure_code="not_charged"), None
    return topup_settle(topup_id=topup_id, result=charge)
