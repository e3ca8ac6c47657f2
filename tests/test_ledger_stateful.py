"""Hypothesis stateful test: random top-ups, payments, refunds, transfers, holds and
captures against a plain-Python model, with the ledger invariants checked after every step
on real PostgreSQL (SPEC 1.4). The merchant has a JPY fee schedule: its balance and the
fees account's follow the model too."""

from __future__ import annotations

from collections import defaultdict
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from payments import selectors
from payments.services.charges import payment_create
from payments.services.intents import payment_intent_authorize, payment_intent_cancel, payment_intent_capture, payment_intent_create
from payments.services.refunds import refund_create
from payments.services.topups import topup_create, topup_credit
from payments.services.transfers import transfer_create
from tests.factories import CustomerFactory, TerminalFactory
from tests.test_fees import fees_balance, merchant_balance, schedule
from wallets.errors import AmountInvalid, CapExceeded, InsufficientFunds
from wallets.models import Asset
from wallets.selectors import asset_totals, balance_entry_mismatches, ledger_orphan_references, ledger_unbalanced_transactions

CAP = 5_000
BONUS = Decimal("0.1")
POINTS_RATE = Decimal("0.01")
GRAMS_RATE = Decimal("0.5")
ASSETS = ("JPY", "LOCAL")
FEE_RATE, FEE_FIXED = Decimal("0.03"), 2  # the merchant's JPY schedule, ROUND_HALF_UP
amounts = st.integers(min_value=1, max_value=3_000)


def fee_of(amount: int) -> int:
    return min(amount, int((Decimal(amount) * FEE_RATE).to_integral_value(rounding=ROUND_HALF_UP)) + FEE_FIXED)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.customers = [CustomerFactory() for _ in range(3)]
        self.terminal = TerminalFactory()
        schedule(merchant=self.terminal.store.merchant, rate=str(FEE_RATE), rounding=ROUND_HALF_UP, fixed=FEE_FIXED)
        self.merchant_jpy, self.fees_jpy = 0, fees_balance()  # what the merchant and the fees account hold, modelled
        # model[(customer index, asset)] = [balance, held]
        self.model: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
        self.payments: list[dict[str, Any]] = []
        self.intents: list[dict[str, Any]] = []

    def available(self, who: int, asset: str) -> int:
        balance, held = self.model[(who, asset)]
        return balance - held

    @rule(who=st.integers(0, 2), asset=st.sampled_from(ASSETS), amount=amounts)
    def top_up(self, who: int, asset: str, amount: int) -> None:
        bonus = int((Decimal(amount) * BONUS).to_integral_value(rounding=ROUND_FLOOR))
        cap = CAP if asset == "LOCAL" else None
        if cap is not None and self.model[(who, asset)][0] + amount + bonus > cap:
            with pytest.raises(CapExceeded):
                topup_create(customer=self.customers[who], asset_code=asset, amount=amount, payment_method="card")
            return
        topup = topup_create(customer=self.customers[who], asset_code=asset, amount=amount, payment_method="card")
        topup_credit(topup=topup)
        self.model[(who, asset)][0] += amount + bonus

    @rule(who=st.integers(0, 2), asset=st.sampled_from(ASSETS), amount=amounts)
    def pay(self, who: int, asset: str, amount: int) -> None:
        if self.available(who, asset) < amount:
            with pytest.raises(InsufficientFunds):
                payment_create(terminal=self.terminal, customer=self.customers[who], asset_code=asset, amount=amount)
            return
        payment = payment_create(terminal=self.terminal, customer=self.customers[who], asset_code=asset, amount=amount)
        points = grams = 0
        if asset == "JPY":
            points = int((Decimal(amount) * POINTS_RATE).to_integral_value(rounding=ROUND_FLOOR))
            grams = int((Decimal(amount) * GRAMS_RATE).to_integral_value(rounding=ROUND_HALF_EVEN))
        assert (payment.points_earned, payment.carbon_grams) == (points, grams)
        fee = fee_of(amount) if asset == "JPY" else 0
        assert (payment.fee, payment.net) == (fee, amount - fee)
        if asset == "JPY":
            self.merchant_jpy, self.fees_jpy = self.merchant_jpy + amount - fee, self.fees_jpy + fee
        self.model[(who, asset)][0] -= amount
        self.model[(who, "POINT")][0] += points
        self.model[(who, "CARBON")][0] += grams
        self.payments.append(
            {"obj": payment, "who": who, "asset": asset, "amount": amount, "refunded": 0, "points": points, "points_back": 0,
             "grams": grams, "grams_back": 0, "fee": fee}
        )

    @precondition(lambda self: self.payments)
    @rule(index=st.integers(0, 10_000), amount=amounts)
    def refund(self, index: int, amount: int) -> None:
        p = self.payments[index % len(self.payments)]
        who, asset = p["who"], p["asset"]
        if amount > p["amount"] - p["refunded"]:
            with pytest.raises(AmountInvalid):
                refund_create(payment=p["obj"], amount=amount)
            return
        if asset == "LOCAL" and self.model[(who, asset)][0] + amount > CAP:
            with pytest.raises(CapExceeded):
                refund_create(payment=p["obj"], amount=amount)
            return
        refund = refund_create(payment=p["obj"], amount=amount)
        after = p["refunded"] + amount
        points_back = min(p["points"] * after // p["amount"] - p["points_back"], self.available(who, "POINT"))
        grams_back = min(p["grams"] * after // p["amount"] - p["grams_back"], self.available(who, "CARBON"))
        points_back, grams_back = max(points_back, 0), max(grams_back, 0)
        assert (refund.points_reversed, refund.carbon_grams_reversed) == (points_back, grams_back)
        fee_back = p["fee"] * after // p["amount"] - p["fee"] * p["refunded"] // p["amount"]  # the tenant's default: proportional
        assert refund.fee == fee_back
        if asset == "JPY":
            self.merchant_jpy, self.fees_jpy = self.merchant_jpy - (amount - fee_back), self.fees_jpy - fee_back
        p["refunded"], p["points_back"], p["grams_back"] = after, p["points_back"] + points_back, p["grams_back"] + grams_back
        self.model[(who, asset)][0] += amount
        self.model[(who, "POINT")][0] -= points_back
        self.model[(who, "CARBON")][0] -= grams_back

    @rule(source=st.integers(0, 2), recipient=st.integers(0, 2), asset=st.sampled_from((*ASSETS, "POINT")), amount=amounts)
    def transfer(self, source: int, recipient: int, asset: str, amount: int) -> None:
        target = recipient
        if source == target:
            return
        call = lambda: transfer_create(  # noqa: E731
            from_customer=self.customers[source], to_customer=self.customers[target], asset_code=asset, amount=amount
        )
        if self.available(source, asset) < amount:
            with pytest.raises(InsufficientFunds):
                call()
            return
        if asset == "LOCAL" and self.model[(target, asset)][0] + amount > CAP:
            with pytest.raises(CapExceeded):
                call()
            return
        call()
        self.model[(source, asset)][0] -= amount
        self.model[(target, asset)][0] += amount

    @rule(who=st.integers(0, 2), amount=amounts)
    def hold(self, who: int, amount: int) -> None:
        intent = payment_intent_create(
            merchant=self.terminal.store.merchant, customer=self.customers[who], asset_code="JPY", amount=amount, capture_method="manual"
        )
        if self.available(who, "JPY") < amount:
            with pytest.raises(InsufficientFunds):
                payment_intent_authorize(intent=intent)
            return
        payment_intent_authorize(intent=intent)
        self.model[(who, "JPY")][1] += amount
        self.intents.append({"obj": intent, "who": who, "amount": amount})

    @precondition(lambda self: self.intents)
    @rule(index=st.integers(0, 10_000), fraction=st.integers(0, 100), cancel=st.booleans())
    def capture_or_cancel(self, index: int, fraction: int, cancel: bool) -> None:
        entry = self.intents.pop(index % len(self.intents))
        who, amount = entry["who"], entry["amount"]
        self.model[(who, "JPY")][1] -= amount
        if cancel:
            payment_intent_cancel(intent=entry["obj"])
            return
        capture = max(1, amount * fraction // 100)
        captured = payment_intent_capture(intent=entry["obj"], amount=capture)
        assert captured.payment is not None and captured.payment.fee == fee_of(capture)
        self.merchant_jpy, self.fees_jpy = self.merchant_jpy + capture - fee_of(capture), self.fees_jpy + fee_of(capture)
        points = int((Decimal(capture) * POINTS_RATE).to_integral_value(rounding=ROUND_FLOOR))
        grams = int((Decimal(capture) * GRAMS_RATE).to_integral_value(rounding=ROUND_HALF_EVEN))
        self.model[(who, "JPY")][0] -= capture
        self.model[(who, "POINT")][0] += points
        self.model[(who, "CARBON")][0] += grams

    @rule(who=st.integers(0, 2), bad=st.sampled_from([0, -1, -3000, 10**15 + 1, 2.5, 10.0, True, "5"]))
    def bad_amount_changes_nothing(self, who: int, bad: Any) -> None:
        expected = TypeError if isinstance(bad, float) else AmountInvalid
        with pytest.raises(expected):
            payment_create(terminal=self.terminal, customer=self.customers[who], asset_code="JPY", amount=bad)
        with pytest.raises(expected):
            transfer_create(from_customer=self.customers[who], to_customer=self.customers[(who + 1) % 3], asset_code="JPY", amount=bad)

    @invariant()
    def balances_match_the_model_and_the_ledger(self) -> None:
        for who, customer in enumerate(self.customers):
            for line in selectors.wallet_balances(customer=customer):
                balance, held = self.model[(who, line["asset"])]
                assert (line["balance"], line["held"]) == (balance, held), (who, line)
                assert line["balance"] >= 0 and line["available"] >= 0
                if line["asset"] == "LOCAL":
                    assert line["balance"] <= CAP
        assert (merchant_balance(self.terminal), fees_balance()) == (self.merchant_jpy, self.fees_jpy)
        assert ledger_unbalanced_transactions() == []
        assert balance_entry_mismatches() == []
        assert ledger_orphan_references() == []
        assert all(total == 0 for total in asset_totals().values()), asset_totals()


@pytest.mark.slow
@pytest.mark.django_db
def test_ledger_state_machine(tenant) -> None:  # type: ignore[no-untyped-def]
    Asset.objects.update_or_create(code="LOCAL", defaults={"name": "Local currency", "kind": "regional", "cap": CAP})
    saved = (tenant.topup_bonus_rate, tenant.points_earn_rate, tenant.carbon_grams_per_unit)
    tenant.topup_bonus_rate, tenant.points_earn_rate, tenant.carbon_grams_per_unit = BONUS, POINTS_RATE, GRAMS_RATE
    try:
        run_state_machine_as_test(
            LedgerMachine,
            settings=settings(
                max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck), database=None
            ),
        )
    finally:
        tenant.topup_bonus_rate, tenant.points_earn_rate, tenant.carbon_grams_per_unit = saved
