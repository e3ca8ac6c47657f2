"""Payment intents (SPEC 7): merchant-initiated charges. Automatic capture: created ->
charge_requested -> charged, or charge_failed on a business refusal. Manual capture:
created -> authorized (a hold) -> captured (a partial capture releases the rest), or
canceled. The amount changes only while created. Every transition is a compare-and-set on
`version`, so two concurrent confirms charge once. Each public function works on a copy of
the caller's intent and copies the new state back only once its transaction succeeded."""

from __future__ import annotations

import copy
from typing import Any

from django.db.models import F
from django.utils import timezone

from payments.locks import payment_intent_lock
from payments.models import CaptureMethod, PaymentIntent, PaymentIntentStatus
from payments.services.charges import charge
from payments.services.mandates import charge_by_customer_id_check
from payments.services.outbox import outbox_event_create
from wallets.errors import AmountInvalid, AssetUnknown, InsufficientFunds, InvalidRequest, InvalidState, NotFound, WalletFrozen
from wallets.locks import hold_lock
from wallets.models import Customer, Merchant
from wallets.money import amount_to_minor
from wallets.selectors import asset_get, customer_accounts_get
from wallets.services.ledger import hold_place, hold_release
from wallets.transactions import atomic_service

_STATE_FIELDS = ("status", "version", "amount", "amount_captured", "hold_id", "payment_id", "failure_code", "updated")


@atomic_service(operation="payment_intent_create")
def payment_intent_create(
    *, merchant: Merchant, customer: Customer, asset_code: str, amount: object, capture_method: str = CaptureMethod.AUTOMATIC
) -> PaymentIntent:
    """A new intent in `created`; charging by customer id needs the tenant's setting or a
    mandate (checked again when the intent charges or holds). Locks: none."""
    minor = amount_to_minor(amount)
    charge_by_customer_id_check(customer_id=customer.pk, merchant_id=merchant.pk)
    if capture_method not in CaptureMethod.values:
        raise InvalidRequest("capture_method must be automatic or manual", param="capture_method")
    asset = asset_get(asset_code=asset_code)
    intent = PaymentIntent.objects.create(merchant=merchant, customer=customer, asset=asset, amount=minor, capture_method=capture_method)
    outbox_event_create(topic="payment_intent.created", payload=_payload(intent))
    return intent


def payment_intent_update_amount(*, intent: PaymentIntent, amount: object) -> PaymentIntent:
    """Change the amount; only while `created` (else InvalidState). Locks: the intent row."""
    minor = amount_to_minor(amount)
    return _sync(intent, _update_amount(intent=copy.copy(intent), amount=minor))


def payment_intent_confirm(*, intent: PaymentIntent) -> PaymentIntent:
    """Automatic capture: charge now; a business refusal ends in charge_failed, returned,
    not raised. Manual capture: authorize. Locks: the intent row, then the charge's
    balance rows (charges.charge)."""
    if intent.capture_method == CaptureMethod.MANUAL:
        return payment_intent_authorize(intent=intent)
    return _sync(intent, _confirm(intent=copy.copy(intent)))


def payment_intent_authorize(*, intent: PaymentIntent) -> PaymentIntent:
    """Manual capture: created -> authorized, holding the amount on the customer's wallet.
    Locks: the intent row, then the customer's balance row."""
    if intent.capture_method != CaptureMethod.MANUAL:
        raise InvalidState("only manual-capture intents are authorized", param=None)
    return _sync(intent, _authorize(intent=copy.copy(intent)))


def payment_intent_capture(*, intent: PaymentIntent, amount: object = None) -> PaymentIntent:
    """authorized -> captured: charge `amount` (default: all of it, at most the authorized
    amount) and release the rest of the hold. Locks: the intent row, the hold, then the
    charge's balance rows."""
    minor = None if amount is None else amount_to_minor(amount)
    return _sync(intent, _capture(intent=copy.copy(intent), amount=minor))


def payment_intent_cancel(*, intent: PaymentIntent) -> PaymentIntent:
    """created | authorized -> canceled, releasing any hold. Locks: the intent row, the
    hold, the customer's balance row."""
    return _sync(intent, _cancel(intent=copy.copy(intent)))


@atomic_service(operation="payment_intent_update_amount")
def _update_amount(*, intent: PaymentIntent, amount: int) -> PaymentIntent:
    return _cas(intent, expected=(PaymentIntentStatus.CREATED,), amount=amount)


@atomic_service(operation="payment_intent_confirm")
def _confirm(*, intent: PaymentIntent) -> PaymentIntent:
    charge_by_customer_id_check(customer_id=intent.customer_id, merchant_id=intent.merchant_id)
    requested = _cas(intent, expected=(PaymentIntentStatus.CREATED,), status=PaymentIntentStatus.CHARGE_REQUESTED)
    try:
        # charge refuses before it writes, so the failure is recorded in this transaction.
        payment = charge(
            customer_id=requested.customer_id, merchant_id=requested.merchant_id, store_id=None, terminal_id=None,
            asset_code=requested.asset_id, amount=requested.amount,
        )
    except (InsufficientFunds, WalletFrozen, AssetUnknown) as refusal:
        failed = _cas(
            requested, expected=(PaymentIntentStatus.CHARGE_REQUESTED,), status=PaymentIntentStatus.CHARGE_FAILED, failure_code=refusal.code
        )
        outbox_event_create(topic="payment_intent.charge_failed", payload=_payload(failed))
        return failed
    charged = _cas(
        requested, expected=(PaymentIntentStatus.CHARGE_REQUESTED,), status=PaymentIntentStatus.CHARGED,
        payment_id=payment.pk, amount_captured=requested.amount,
    )
    outbox_event_create(topic="payment_intent.charged", payload=_payload(charged))
    return charged


@atomic_service(operation="payment_intent_authorize")
def _authorize(*, intent: PaymentIntent) -> PaymentIntent:
    charge_by_customer_id_check(customer_id=intent.customer_id, merchant_id=intent.merchant_id)
    _expect(_lock(intent), intent, expected=(PaymentIntentStatus.CREATED,))
    account = customer_accounts_get(customer_ids=[intent.customer_id])[intent.customer_id]
    hold = hold_place(account=account, asset_code=intent.asset_id, amount=intent.amount, reference=intent.pk)
    authorized = _cas(intent, expected=(PaymentIntentStatus.CREATED,), status=PaymentIntentStatus.AUTHORIZED, hold_id=hold.pk)
    outbox_event_create(topic="payment_intent.authorized", payload=_payload(authorized))
    return authorized


@atomic_service(operation="payment_intent_capture")
def _capture(*, intent: PaymentIntent, amount: int | None) -> PaymentIntent:
    locked = _lock(intent)
    _expect(locked, intent, expected=(PaymentIntentStatus.AUTHORIZED,))
    capture = locked.amount if amount is None else amount
    if capture > locked.amount:
        raise AmountInvalid(f"amount exceeds the authorized {locked.amount}", param="amount")
    assert locked.hold_id is not None
    hold = hold_lock(hold_id=locked.hold_id)
    # The charge consumes the whole hold (the uncaptured rest goes back to available) in
    # its own posting, so the capture locks its balance rows once.
    payment = charge(
        customer_id=locked.customer_id, merchant_id=locked.merchant_id, store_id=None, terminal_id=None,
        asset_code=locked.asset_id, amount=capture, consume_hold=hold,
    )
    captured = _cas(
        intent, expected=(PaymentIntentStatus.AUTHORIZED,), status=PaymentIntentStatus.CAPTURED, amount_captured=capture, payment_id=payment.pk
    )
    outbox_event_create(topic="payment_intent.captured", payload=_payload(captured))
    return captured


@atomic_service(operation="payment_intent_cancel")
def _cancel(*, intent: PaymentIntent) -> PaymentIntent:
    canceled = _cas(intent, expected=(PaymentIntentStatus.CREATED, PaymentIntentStatus.AUTHORIZED), status=PaymentIntentStatus.CANCELED)
    if canceled.hold is not None:
        hold_release(hold=canceled.hold)
    outbox_event_create(topic="payment_intent.canceled", payload=_payload(canceled))
    return canceled


def _lock(intent: PaymentIntent) -> PaymentIntent:
    locked = payment_intent_lock(intent_id=intent.pk)
    if locked is None:
        raise NotFound("no such payment intent", param="payment_intent")
    return locked


def _expect(current: PaymentIntent, intent: PaymentIntent, *, expected: tuple[str, ...]) -> None:
    if current.version != intent.version or current.status not in expected:
        raise InvalidState(
            f"payment intent is {current.status} (version {current.version}); expected {' or '.join(expected)} at version {intent.version}",
            param=None,
        )


def _cas(intent: PaymentIntent, *, expected: tuple[str, ...], **changes: Any) -> PaymentIntent:
    """Compare-and-set: apply `changes` only if the row still has the caller's version and
    one of the `expected` statuses; bumps the version. Locks: the intent row (until commit)."""
    updated = PaymentIntent.objects.filter(pk=intent.pk, version=intent.version, status__in=expected).update(
        version=F("version") + 1, updated=timezone.now(), **changes
    )
    if updated != 1:
        current = PaymentIntent.objects.filter(pk=intent.pk).first()
        if current is None:
            raise NotFound("no such payment intent", param="payment_intent")
        _expect(current, intent, expected=expected)
        raise InvalidState("payment intent changed concurrently", param=None)
    fresh = PaymentIntent.objects.get(pk=intent.pk)
    return _sync(intent, fresh)


def _sync(target: PaymentIntent, source: PaymentIntent) -> PaymentIntent:
    for field in _STATE_FIELDS:
        setattr(target, field, getattr(source, field))
    return source


def _payload(intent: PaymentIntent) -> dict[str, Any]:
    return {
        "id": intent.id, "object": "payment_intent", "status": intent.status, "merchant": intent.merchant_id,
        "customer": intent.customer_id, "asset": intent.asset_id, "amount": intent.amount,
        "amount_captured": intent.amount_captured, "capture_method": intent.capture_method, "payment": intent.payment_id,
    }
