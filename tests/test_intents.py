"""Payment intents (SPEC 7): states, compare-and-set on the version, holds."""

from __future__ import annotations

import pytest

from payments import selectors
from payments.models import OutboxEvent, PaymentIntent
from payments.services.freezes import wallet_freeze
from payments.services.intents import (
    payment_intent_authorize,
    payment_intent_cancel,
    payment_intent_capture,
    payment_intent_confirm,
    payment_intent_create,
    payment_intent_update_amount,
)
from payments.services.transfers import transfer_create
from tests.factories import CustomerFactory, MerchantFactory, fund, staff
from wallets.errors import AmountInvalid, InvalidState, WalletFrozen
from wallets.models import Hold
from wallets.selectors import balance_entry_mismatches, ledger_unbalanced_transactions

pytestmark = pytest.mark.django_db


def _jpy(customer) -> dict:  # type: ignore[no-untyped-def]
    return next(dict(line) for line in selectors.wallet_balances(customer=customer) if line["asset"] == "JPY")


def test_automatic_intent_amount_change_then_confirm_charges(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer = MerchantFactory(), CustomerFactory()
    fund(customer, 1_000)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=300)
    assert (intent.status, intent.version) == ("created", 1)
    payment_intent_update_amount(intent=intent, amount=450)
    assert (intent.amount, intent.version) == (450, 2)
    payment_intent_confirm(intent=intent)
    assert intent.status == "charged" and intent.payment_id is not None
    assert _jpy(customer)["balance"] == 550
    with pytest.raises(InvalidState):
        payment_intent_update_amount(intent=intent, amount=10)
    with pytest.raises(InvalidState):
        payment_intent_confirm(intent=intent)
    assert _jpy(customer)["balance"] == 550


def test_stale_version_is_refused(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer = MerchantFactory(), CustomerFactory()
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=300)
    stale = PaymentIntent.objects.get(pk=intent.pk)
    payment_intent_update_amount(intent=intent, amount=200)
    with pytest.raises(InvalidState):
        payment_intent_update_amount(intent=stale, amount=999)
    assert PaymentIntent.objects.get(pk=intent.pk).amount == 200


def test_confirm_without_funds_is_charge_failed_and_moves_nothing(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer = MerchantFactory(), CustomerFactory()
    fund(customer, 100)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=300)
    result = payment_intent_confirm(intent=intent)
    assert (result.status, result.failure_code) == ("charge_failed", "insufficient_funds")
    assert PaymentIntent.objects.get(pk=intent.pk).status == "charge_failed"
    assert _jpy(customer)["balance"] == 100
    assert OutboxEvent.objects.filter(topic="payment_intent.charge_failed", payload__id=intent.pk).exists()


def test_manual_authorize_holds_then_partial_capture_releases_the_rest(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer, other = MerchantFactory(), CustomerFactory(), CustomerFactory()
    fund(customer, 1_000)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=600, capture_method="manual")
    payment_intent_confirm(intent=intent)  # manual: confirm authorizes
    assert intent.status == "authorized"
    assert _jpy(customer) == {"asset": "JPY", "balance": 1_000, "available": 400, "held": 600}
    # Held funds cannot be spent elsewhere.
    with pytest.raises(Exception, match="insufficient"):
        transfer_create(from_customer=customer, to_customer=other, asset_code="JPY", amount=401)
    with pytest.raises(AmountInvalid):
        payment_intent_capture(intent=intent, amount=601)
    payment_intent_capture(intent=intent, amount=250)
    assert (intent.status, intent.amount_captured) == ("captured", 250)
    assert _jpy(customer) == {"asset": "JPY", "balance": 750, "available": 750, "held": 0}
    assert Hold.objects.get(pk=intent.hold_id).status == "captured"
    merchant_jpy = next(line for line in selectors.merchant_balances(merchant=merchant) if line["asset"] == "JPY")
    assert merchant_jpy["balance"] == 250
    with pytest.raises(InvalidState):
        payment_intent_cancel(intent=intent)
    assert ledger_unbalanced_transactions() == [] and balance_entry_mismatches() == []


def test_cancel_an_authorization_releases_the_hold(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer = MerchantFactory(), CustomerFactory()
    fund(customer, 1_000)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=600, capture_method="manual")
    payment_intent_authorize(intent=intent)
    payment_intent_cancel(intent=intent)
    assert intent.status == "canceled"
    assert _jpy(customer) == {"asset": "JPY", "balance": 1_000, "available": 1_000, "held": 0}
    with pytest.raises(InvalidState):
        payment_intent_capture(intent=intent)


def test_bad_intent_input(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer = MerchantFactory(), CustomerFactory()
    with pytest.raises(AmountInvalid):
        payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=0)
    with pytest.raises(TypeError):
        payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=1.5)
    with pytest.raises(Exception, match="capture_method"):
        payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=1, capture_method="later")
    assert not PaymentIntent.objects.filter(customer=customer).exists()


def test_frozen_wallet_cannot_be_authorized(tenant) -> None:  # type: ignore[no-untyped-def]
    merchant, customer = MerchantFactory(), CustomerFactory()
    fund(customer, 1_000)
    wallet_freeze(customer=customer, staff=staff(), reason="check")
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=100, capture_method="manual")
    with pytest.raises(WalletFrozen):
        payment_intent_authorize(intent=intent)
    assert PaymentIntent.objects.get(pk=intent.pk).status == "created"
    assert (intent.status, intent.version) == ("created", 1)  # the caller's object is not half-updated
    assert _jpy(customer)["held"] == 0
