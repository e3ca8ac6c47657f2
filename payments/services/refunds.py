"""Refunds: of a payment (merchant -> customer in the ledger), and of a card top-up that
ended without a credit (the card given back what the PSP charged, by the recovery pass)."""

from __future__ import annotations

import functools
import logging

from django.db.models import F
from django.utils import timezone

from payments import selectors as payment_selectors
from payments.errors import RefundWindowClosed
from payments.gateways import metrics
from payments.gateways.base import Gateway as PspGateway
from payments.gateways.base import GatewayError
from payments.gateways.registry import gateway_build
from payments.locks import payment_lock, topup_lock
from payments.models import Payment, Refund, TopUp
from payments.selectors import gateway_account_get, topups_charged_uncredited
from payments.services.outbox import epoch_seconds, outbox_event_create
from payments.services.topup_budget import LoopBudget, recovery_step_isolated, topups_in_turn
from payments.services.topups import topup_last_error_note
from tenants.models import RefundFeePolicy
from tenants.selectors import tenant_current
from wallets import ids
from wallets.errors import AmountInvalid, NotFound
from wallets.locks import balance_rows_lock
from wallets.models import CARBON_ASSET, POINTS_ASSET, LedgerTransactionKind, SystemRole, Terminal
from wallets.money import amount_to_minor, proportion_floor, proportion_share
from wallets.selectors import movement_accounts_get
from wallets.services.ledger import Leg, available, ledger_post, ledger_wants
from wallets.transactions import atomic_service

logger = logging.getLogger("tally.topups")


@atomic_service(operation="refund_create")
def refund_create(*, payment: Payment, amount: object, reason: str = "") -> Refund:
    """Refund part or all of a payment, never more than is left; repeatable. Rewards go back
    in proportion (cumulative floor: a full refund returns exactly what was earned), never
    below what the customer still holds. The fee goes back from the fees account under the
    tenant's `proportional` policy, its share by the same cumulative floor (never more than
    the fee, all of it once fully refunded); the merchant gives the rest. Locks: the payment
    row, then the balance rows in one statement (customer rows, every shard of the
    merchant's asset, the system shards)."""
    minor = amount_to_minor(amount)
    reason = str(reason)[:500]
    locked_payment = payment_lock(payment_id=payment.pk)
    if locked_payment is None:
        raise NotFound("no such payment", param="payment")
    if minor > locked_payment.amount_refundable:
        raise AmountInvalid(f"amount exceeds what is left to refund ({locked_payment.amount_refundable})", param="amount")
    accounts = movement_accounts_get(
        customer_id=locked_payment.customer_id, merchant_id=locked_payment.merchant_id,
        system_roles=(SystemRole.BONUS_POOL, SystemRole.CARBON_REGISTRY, SystemRole.FEES),
    )
    customer, merchant = accounts.customer, accounts.merchant
    assert customer is not None and merchant is not None  # accounts are undeletable
    bonus_pool, registry = accounts.system_account(SystemRole.BONUS_POOL), accounts.system_account(SystemRole.CARBON_REGISTRY)
    fees = accounts.system_account(SystemRole.FEES)
    refunded_after, whole = locked_payment.amount_refunded + minor, locked_payment.amount
    fee_back = 0
    if tenant_current().refund_fee_policy == RefundFeePolicy.PROPORTIONAL:  # this refund's share (one under `none` kept its own)
        fee_back = proportion_share(total=locked_payment.fee, part_from=locked_payment.amount_refunded, part_to=refunded_after, whole=whole)
    points_back = proportion_floor(total=locked_payment.points_earned, part=refunded_after, whole=whole) - locked_payment.points_reversed
    grams_back = proportion_floor(total=locked_payment.carbon_grams, part=refunded_after, whole=whole) - locked_payment.carbon_grams_reversed

    def legs_for(points_back: int, grams_back: int) -> list[Leg]:
        asset = locked_payment.asset_id
        legs = [Leg(merchant, asset, fee_back - minor)] if minor > fee_back else []
        if fee_back > 0:
            legs += [Leg(fees, asset, -fee_back)]
        legs += [Leg(customer, asset, minor)]
        if points_back > 0:
            legs += [Leg(customer, POINTS_ASSET, -points_back), Leg(bonus_pool, POINTS_ASSET, points_back)]
        if grams_back > 0:
            legs += [Leg(customer, CARBON_ASSET, -grams_back), Leg(registry, CARBON_ASSET, grams_back)]
        return legs

    locked = balance_rows_lock(wants=ledger_wants(legs_for(points_back, grams_back)))
    points_back = max(0, min(points_back, available(locked=locked, account=customer, asset_code=POINTS_ASSET)))
    grams_back = max(0, min(grams_back, available(locked=locked, account=customer, asset_code=CARBON_ASSET)))
    refund_id = ids.new_refund_id()
    txn = ledger_post(kind=LedgerTransactionKind.REFUND, reference=refund_id, legs=legs_for(points_back, grams_back), locked=locked)
    Payment.objects.filter(pk=locked_payment.pk).update(
        amount_refunded=F("amount_refunded") + minor,
        points_reversed=F("points_reversed") + points_back,
        carbon_grams_reversed=F("carbon_grams_reversed") + grams_back,
        fee_refunded=F("fee_refunded") + fee_back,
    )
    refund = Refund.objects.create(
        id=refund_id, payment=locked_payment, amount=minor, reason=reason,
        points_reversed=points_back, carbon_grams_reversed=grams_back, fee=fee_back, ledger_transaction=txn,
    )
    outbox_event_create(
        topic="refund.succeeded",
        payload={
            "id": refund.id, "object": "refund", "payment": locked_payment.id, "amount": minor, "fee": fee_back, "asset": locked_payment.asset_id,
            "merchant": locked_payment.merchant_id, "customer": locked_payment.customer_id, "reason": reason,
            "created": epoch_seconds(refund.created),
        },
    )
    payment.amount_refunded = refunded_after
    return refund


def terminal_refund_create(*, terminal: Terminal, payment_id: str, amount: object, reason: str = "") -> Refund:
    """A terminal's refund: only of its own store's payment (else NotFound, SPEC 4), on the
    day it was taken (RefundWindowClosed). Locks: as `refund_create`."""
    payment = payment_selectors.payment_get(payment_id=payment_id, store_id=terminal.store_id)
    if timezone.localdate(payment.created) != timezone.localdate():
        raise RefundWindowClosed("a terminal refunds only same-day payments; refund older ones from the merchant account", param="payment")
    return refund_create(payment=payment, amount=amount, reason=reason)


def topup_refunds_run(*, batch_size: int = 100, budget: LoopBudget | None = None) -> dict[str, int]:
    """Refund the card of every charged top-up that ended without a credit (key
    `<top-up id>:refund`), in turn (topup_budget.topups_in_turn) while `budget` lasts; one
    that fails is counted and tried again next run. Returns counts by outcome.
    Locks: each top-up row, briefly, to record the refund."""
    counts = {"refunded": 0, "refund_unavailable": 0, "refund_errors": 0}
    names = {"refunded": "refunded", "unavailable": "refund_unavailable", "error": "refund_errors"}
    owed = topups_in_turn(
        loop="refunds", topups=topups_charged_uncredited(), batch_size=batch_size, budget=budget or LoopBudget(seconds=float("inf"))
    )
    for topup in owed:
        outcome = recovery_step_isolated(step="refund", topup_id=topup.pk, fn=functools.partial(_refund_one, topup))
        counts[names[outcome]] += 1
        metrics.TOPUP_CARD_REFUNDS.labels(outcome=outcome).inc()
    return counts


def _refund_one(topup: TopUp) -> str:
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=topup.gateway))
        # What the PSP charged, not what we asked for; rows recorded before it was kept
        # (some by an older branch, unchecked) ask the PSP what the charge was.
        amount = topup.psp_charged_amount if topup.psp_charged_amount is not None else _charged_amount_at_psp(gateway, topup)
        if amount is None:
            topup_last_error_note(topup_id=topup.pk, error=f"card refund: the PSP does not list the charge {topup.psp_reference}")
            return "unavailable"
        refund = gateway.refund(psp_reference=topup.psp_reference, amount=amount, idempotency_key=f"{topup.pk}:refund")
    except (GatewayError, NotFound) as exc:
        logger.warning("card refund of an uncredited top-up failed; retried next run", extra={"topup": topup.pk, "error": str(exc)})
        topup_last_error_note(topup_id=topup.pk, error=f"card refund: {exc}")
        return "unavailable"
    _refund_record(topup_id=topup.pk, reference=refund.psp_reference)
    return "refunded"


def _charged_amount_at_psp(gateway: PspGateway, topup: TopUp) -> int | None:
    """The recorded charge's amount as the PSP lists it under the top-up's id, or None when
    it does not list it as successful. Raises GatewayError."""
    for charge in gateway.charges_of(reference=topup.pk):
        if charge.psp_reference == topup.psp_reference and charge.status == "succeeded":
            return charge.amount
    return None


@atomic_service(operation="topup_refund_record")
def _refund_record(*, topup_id: str, reference: str) -> None:
    topup = topup_lock(topup_id=topup_id)
    if topup is not None and not topup.psp_refund_reference:
        topup.psp_refund_reference = reference[:200]
        topup.save(update_fields=["psp_refund_reference", "updated"])
        outbox_event_create(topic="topup.card_refunded", payload={"id": topup.id, "object": "topup", "psp_refund": reference})
