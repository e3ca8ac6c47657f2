"""The operator queue of card top-ups (`card_topups.topup_review_hold`): a staff member
settles one from the back office by what the PSP holds for it (a search by the top-up id
in the charge's metadata, safe however old the key), never by what a person typed."""

from __future__ import annotations

import logging

from payments.errors import PspUnavailable
from payments.gateways.base import ChargeResult, GatewayError
from payments.gateways.registry import gateway_build
from payments.locks import topup_lock
from payments.models import TopUp, TopUpStatus
from payments.selectors import gateway_account_get, topup_get
from payments.services.card_topups import topup_fail, topup_settle
from payments.services.topup_due import topup_recovery_due_now
from wallets.errors import BusinessRefusal, InvalidState, NotFound
from wallets.transactions import run_atomic

logger = logging.getLogger("tally.topups")


def _queued(topup_id: str) -> TopUp:
    topup = topup_lock(topup_id=topup_id)
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    if topup.status != TopUpStatus.PENDING or topup.operator_review_at is None:
        raise InvalidState(f"top-up {topup.pk} is {topup.status} and not waiting for an operator", param=None)
    return topup


def topup_review_settle(*, topup_id: str, reason: str) -> tuple[TopUp, BusinessRefusal | None]:
    """Settle a queued top-up by what its PSP holds: one matching successful charge is
    recorded and credited (as `topup_settle`); none fails it as `not_charged`. More than
    one, or one that does not match, settles nothing: a person sorts it out at the PSP
    first. The PSP is asked before the settlement's own transaction (PspUnavailable when
    it does not answer); the admin's staff action runs all of this inside its idempotency
    claim's transaction, so that read holds the claim row for up to the PSP timeout.
    Locks: the top-up row, the tenant's top-up due-work lock (SHARED), then (when credited)
    the balance rows."""
    queued = topup_get(topup_id=topup_id)
    if queued.status != TopUpStatus.PENDING or queued.operator_review_at is None:
        raise InvalidState(f"top-up {queued.pk} is {queued.status} and not waiting for an operator", param=None)
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=queued.gateway))
        charges = gateway.charges_of(reference=queued.pk)
    except (GatewayError, NotFound) as exc:
        raise PspUnavailable("the card processor did not tell what it holds for this top-up: try again later") from exc
    succeeded = [c for c in charges if c.status == "succeeded"]
    if len(succeeded) > 1:
        raise InvalidState(f"the PSP holds {len(succeeded)} successful charges for {queued.pk}: refund the extra ones there first")
    if succeeded and (succeeded[0].amount != queued.amount or succeeded[0].currency.upper() != queued.asset_id.upper()):
        raise InvalidState(f"the PSP's charge {succeeded[0].psp_reference} does not match the top-up's amount and currency")
    logger.warning(
        "queued top-up settled by an operator from the PSP's records",
        extra={"topup": queued.pk, "psp_reference": succeeded[0].psp_reference if succeeded else "", "reason": reason},
    )
    return run_atomic(lambda: _settle(queued.pk, succeeded[0] if succeeded else None), operation="topup_review_settle")


def _settle(topup_id: str, charge: ChargeResult | None) -> tuple[TopUp, BusinessRefusal | None]:
    topup = _queued(topup_id)
    topup_recovery_due_now()  # the queue shrinks: the next pass shows it in the gauges
    if charge is None:
        return topup_fail(topup=topup, failure_code="not_charged"), None
    return topup_settle(topup_id=topup_id, result=charge)
