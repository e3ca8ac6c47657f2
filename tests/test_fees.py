"""Fees: the math (hypothesis), schedules (validity, override order, the per-process cache),
the fee in the payment's own ledger transaction (both charge strategies, captures), refunds
under both policies, the reconciliation check, and concurrent payments and refunds."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from payments import selectors as payment_selectors
from payments.errors import FeeScheduleStartRefused
from payments.models import FeeRounding, FeeSchedule, OutboxEvent, Payment, Refund
from payments.selectors import fee_terms_forget, fee_terms_in_force
from payments.services import charges
from payments.services.charges import payment_create
from payments.services.fees import fee_schedule_create
from payments.services.intents import payment_intent_authorize, payment_intent_capture, payment_intent_confirm, payment_intent_create
from payments.services.refunds import refund_create
from reconciliation.checks.base import CheckContext
from reconciliation.checks.payments import fee_account_check
from tenants.models import Tenant
from tests.factories import CustomerFactory, MerchantFactory, StoreFactory, TerminalFactory, fund
from tests.test_ledger_concurrency import _deadlocks_retried, _race
from wallets.errors import AssetUnknown, InvalidRequest
from wallets.models import AuditEntry, Balance, LedgerEntry, SystemRole, Terminal
from wallets.money import MAX_AMOUNT, fee_for, proportion_share
from wallets.selectors import asset_totals, balance_entry_mismatches, ledger_unbalanced_transactions

RATES = st.integers(min_value=0, max_value=10**6).map(lambda n: Decimal(n).scaleb(-6))  # 0 to 1, six places


def schedule(*, merchant: Any = None, rate: str = "0.03", rounding: str = FeeRounding.HALF_UP, fixed: int = 5, asset: str = "JPY",
             since: timedelta = timedelta(hours=1)) -> FeeSchedule:
    """A schedule in force since `since` ago. The service refuses a start in the past (a
    schedule applies only to later payments): the test's setup writes the row itself."""
    row = FeeSchedule.objects.create(
        asset_id=asset, merchant=merchant, rate=Decimal(rate), rounding=rounding, fixed=fixed, valid_from=timezone.now() - since
    )
    fee_terms_forget()
    return row


def fees_balance(asset: str = "JPY") -> int:
    return sum(Balance.objects.filter(account__system_role=SystemRole.FEES, asset_id=asset).values_list("balance", flat=True))


def merchant_balance(terminal: Terminal, asset: str = "JPY") -> int:
    return sum(Balance.objects.filter(account__merchant_id=terminal.store.merchant_id, asset_id=asset).values_list("balance", flat=True))


def legs_of(transaction_id: str) -> list[tuple[str, str, int]]:
    """(whose: customer / merchant / a system role, asset, amount) of a transaction's entries."""
    entries = LedgerEntry.objects.filter(transaction_id=transaction_id).select_related("account")
    return sorted((e.account.system_role or e.account.kind, e.asset_id, e.amount) for e in entries)


def ledger_sound() -> None:
    assert ledger_unbalanced_transactions() == [] and balance_entry_mismatches() == []
    assert all(total == 0 for total in asset_totals().values())
    assert list(fee_account_check(CheckContext(now=timezone.now()))) == []


# --- the math ------------------------------------------------------------------------------


@given(amount=st.integers(1, MAX_AMOUNT), rate=RATES, rounding=st.sampled_from(FeeRounding.values), fixed=st.integers(0, MAX_AMOUNT))
def test_a_fee_is_the_rounded_rate_plus_the_fixed_part_and_never_more_than_the_amount(amount: int, rate: Decimal, rounding: str, fixed: int) -> None:
    fee = fee_for(amount=amount, rate=rate, rounding=rounding, fixed=fixed)
    assert 0 <= fee <= amount
    exact = Decimal(amount) * rate
    if fee < amount:  # not cut to the amount: the rate's part is the exact one rounded by the named mode
        assert fee - fixed == int(exact.to_integral_value(rounding=rounding)) and abs((fee - fixed) - exact) < 1
    else:
        assert int(exact.to_integral_value(rounding=rounding)) + fixed >= amount


@given(fee_rate=RATES, parts=st.lists(st.integers(1, 10_000), min_size=1, max_size=40), full=st.booleans())
def test_refund_shares_never_sum_past_the_fee_and_reach_it_when_fully_refunded(fee_rate: Decimal, parts: list[int], full: bool) -> None:
    amount = sum(parts) + (0 if full else 1)
    fee = fee_for(amount=amount, rate=fee_rate, rounding=ROUND_HALF_UP, fixed=0)
    refunded, returned = 0, 0
    for part in parts:
        share = proportion_share(total=fee, part_from=refunded, part_to=refunded + part, whole=amount)
        assert 0 <= share <= part  # the merchant's side of a refund is never negative
        refunded, returned = refunded + part, returned + share
        assert returned <= fee
    assert (returned == fee) if full else (returned <= fee)


# --- schedules -----------------------------------------------------------------------------


def test_the_schedule_in_force_is_the_latest_started_and_a_merchants_own_beats_the_tenant_wide(tenant: Tenant) -> None:
    own, other = MerchantFactory(), MerchantFactory()
    schedule(rate="0.01", since=timedelta(hours=3))
    newer = schedule(rate="0.02", since=timedelta(hours=1))
    later = schedule(rate="0.5", since=-timedelta(hours=1))  # starts in an hour
    mine = schedule(merchant=own, rate="0.1", since=timedelta(hours=2))  # older than the newest tenant-wide one, still beats it
    schedule(merchant=own, rate="0.2", since=-timedelta(hours=2))  # its own next one, not yet
    schedule(asset="POINT", rate="0.9")
    now = timezone.now()

    def in_force(merchant: Any, at: datetime, asset: str = "JPY") -> str | None:
        terms = fee_terms_in_force(merchant_id=merchant.pk, asset_code=asset, at=at)
        return terms.schedule_id if terms else None

    assert in_force(other, now) == newer.pk and in_force(own, now) == mine.pk
    assert in_force(other, now + timedelta(minutes=90)) == later.pk and in_force(own, now + timedelta(minutes=90)) == mine.pk
    assert in_force(other, now - timedelta(hours=4)) is None
    assert in_force(other, now, asset="CARBON") is None
    terminal = TerminalFactory(store=StoreFactory(merchant=own))
    customer = CustomerFactory()
    fund(customer, 10_000)
    assert payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000).fee == 100 + 5


def test_the_payment_path_reads_no_schedule_and_a_new_one_is_known_before_it_starts(tenant: Tenant, settings: Any) -> None:
    """Each process caches a merchant's schedules (no query per payment); the service starts
    a new schedule no sooner than every cache has expired, so a process that cached the old
    ones (here: this one, not told) takes the new one from its first payment in force."""
    settings.TALLY_FEE_SCHEDULE_CACHE_SECONDS, settings.TALLY_FEE_SCHEDULE_GRACE_SECONDS = 0.4, 0.1
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)  # caches the merchant's (no) schedules
    cached = dict(payment_selectors._FEE_TERMS)
    with CaptureQueriesContext(connection) as queries:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    assert not any("payments_feeschedule" in q["sql"] for q in queries.captured_queries)

    started = fee_schedule_create(asset_code="JPY", merchant=terminal.store.merchant, rate=Decimal("0.1"), fixed=0)
    assert started.valid_from >= timezone.now() + timedelta(seconds=0.4)
    payment_selectors._FEE_TERMS.update(cached)  # as another process, not told, still holds them
    assert payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100).fee == 0  # not started yet
    time.sleep(max(0.0, (started.valid_from - timezone.now()).total_seconds()) + 0.01)
    assert payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100).fee == 10


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"rate": 0.03}, "rate"), ({"rate": Decimal("-0.01")}, "rate"), ({"rate": Decimal("1.000001")}, "rate"),
        ({"rate": Decimal("0.0000001")}, "rate"), ({"rate": Decimal("NaN")}, "rate"), ({"rate": "0.03"}, "rate"),
        ({"rounding": "ROUND_05UP"}, "rounding"), ({"rounding": "half"}, "rounding"),
        ({"fixed": -1}, "fixed"), ({"fixed": True}, "fixed"), ({"fixed": 1.0}, "fixed"), ({"fixed": MAX_AMOUNT + 1}, "fixed"),
        ({"valid_from": "past"}, "valid_from"), ({"valid_from": "now"}, "valid_from"),
    ],
)
def test_a_bad_schedule_is_refused_and_adds_nothing(tenant: Tenant, change: dict[str, Any], param: str) -> None:
    valid_from = {"past": timezone.now() - timedelta(days=1), "now": timezone.now()}
    args: dict[str, Any] = {"asset_code": "JPY", "rate": Decimal("0.03"), **change}
    if "valid_from" in change:
        args["valid_from"] = valid_from[change["valid_from"]]
    before = (FeeSchedule.objects.count(), AuditEntry.objects.count())
    with pytest.raises(FeeScheduleStartRefused if param == "valid_from" else InvalidRequest) as refused:
        fee_schedule_create(**args)
    assert refused.value.param == param
    assert (FeeSchedule.objects.count(), AuditEntry.objects.count()) == before


def test_a_schedule_is_added_audited_and_a_second_one_at_the_same_start_refused(tenant: Tenant) -> None:
    merchant = MerchantFactory()
    with pytest.raises(AssetUnknown):
        fee_schedule_create(asset_code="XXX", rate=Decimal("0.01"))
    assert fee_schedule_create(asset_code="JPY", rate=Decimal("0")).valid_from > timezone.now()  # the earliest start, by default
    start = timezone.now() + timedelta(days=1)
    first = fee_schedule_create(asset_code="JPY", merchant=merchant, rate=Decimal("0.029"), rounding=FeeRounding.FLOOR, fixed=30, valid_from=start)
    entry = AuditEntry.objects.get(action="fee_schedule.create", target_id=first.pk)
    assert entry.after == {"asset": "JPY", "merchant": merchant.pk, "rate": "0.029", "rounding": "ROUND_FLOOR", "fixed": 30,
                           "valid_from": first.valid_from.isoformat()}
    with pytest.raises(FeeScheduleStartRefused) as refused:
        fee_schedule_create(asset_code="JPY", merchant=merchant, rate=Decimal("0.01"), valid_from=first.valid_from)
    assert refused.value.param == "valid_from" and FeeSchedule.objects.filter(merchant=merchant).count() == 1
    fee_schedule_create(asset_code="JPY", rate=Decimal("0.01"), valid_from=first.valid_from)  # tenant-wide: another scope


def test_a_start_too_close_by_the_database_s_clock_is_refused_and_adds_nothing(tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    """The earliest start comes from the process's clock before the insert; a commit that
    comes later than the grace (here: a process clock a minute behind) would let another
    process cache the old terms past `valid_from`. The database's clock at the transaction's
    end decides, and the refusal rolls the schedule and its audit entry back."""
    behind = SimpleNamespace(now=lambda: timezone.now() - timedelta(minutes=1))
    monkeypatch.setattr("payments.services.fees.timezone", behind)
    before = (FeeSchedule.objects.count(), AuditEntry.objects.count())
    with pytest.raises(FeeScheduleStartRefused) as refused, transaction.atomic():  # the owner's transaction, as a request's
        fee_schedule_create(asset_code="JPY", rate=Decimal("0.01"))
    assert refused.value.param == "valid_from" and "database" in str(refused.value)
    assert (FeeSchedule.objects.count(), AuditEntry.objects.count()) == before


def test_only_the_one_start_constraint_is_a_refusal(tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: Any, **kwargs: Any) -> None:
        raise IntegrityError("some other constraint")

    monkeypatch.setattr(FeeSchedule, "save", fails)
    with pytest.raises(IntegrityError):
        fee_schedule_create(asset_code="JPY", rate=Decimal("0.01"))


# --- the fee in the payment's own transaction ------------------------------------------------


def test_no_schedule_no_fee(tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_001)
    assert (payment.fee, payment.net) == (0, 1_001) and merchant_balance(terminal) == 1_001
    assert "fees" not in {whose for whose, _, _ in legs_of(payment.ledger_transaction_id)}
    event = OutboxEvent.objects.get(topic="payment.succeeded", payload__id=payment.pk)
    assert (event.payload["fee"], event.payload["net"]) == (0, 1_001)


STRATEGIES = ["write-first (plan read)", "write-first (accounts remembered)", "lock-first"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_both_charge_strategies_take_the_same_fee_with_the_same_legs(tenant: Tenant, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One payment per strategy, same parties and schedule: the same fee, net, payment row and
    ledger legs (merchant amount - fee, fees account fee), in one transaction, and the event."""
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    schedule(rate="0.03", rounding=FeeRounding.HALF_UP, fixed=5)
    if strategy == STRATEGIES[1]:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_001)  # remembers the parties' accounts
    used: list[str] = []
    write_first = charges.charge_write_first
    monkeypatch.setattr(charges, "charge_write_first", lambda *a: used.append("write") or (None if strategy == "lock-first" else write_first(*a)))
    fees_before, merchant_before = fees_balance(), merchant_balance(terminal)

    with CaptureQueriesContext(connection) as queries:
        payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_001)

    assert used == ["write"]
    sent = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith("SET search_path")]
    assert any(sql.startswith("SAVEPOINT") for sql in sent) == (strategy != "lock-first")
    assert sent[0].startswith("SAVEPOINT") == (strategy == STRATEGIES[1])  # remembered: no plan read
    assert (payment.fee, payment.net) == (35, 966)  # 30.03 half up = 30, + 5
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.fee, stored.net, stored.fee_refunded, stored.points_earned, stored.carbon_grams) == (35, 966, 0, 10, 500)
    assert legs_of(payment.ledger_transaction_id) == sorted([
        ("customer", "JPY", -1_001), ("merchant", "JPY", 966), ("fees", "JPY", 35),
        ("customer", "POINT", 10), ("bonus_pool", "POINT", -10), ("customer", "CARBON", 500), ("carbon_registry", "CARBON", -500),
    ])
    assert (fees_balance() - fees_before, merchant_balance(terminal) - merchant_before) == (35, 966)
    if strategy == STRATEGIES[1]:
        assert any(key[1] == customer.pk and key[-1] for key in charges._KNOWN_ACCOUNTS)  # still remembered, fee and all
    event = OutboxEvent.objects.get(topic="payment.succeeded", payload__id=payment.pk)
    assert (event.payload["amount"], event.payload["fee"], event.payload["net"]) == (1_001, 35, 966)
    ledger_sound()


def test_a_fee_never_exceeds_the_amount_and_the_merchant_then_gets_no_leg(tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    schedule(rate="0.5", fixed=100)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=50)
    assert (payment.fee, payment.net) == (50, 0)
    assert legs_of(payment.ledger_transaction_id) == sorted([("customer", "JPY", -50), ("fees", "JPY", 50), ("customer", "CARBON", 25),
                                                             ("carbon_registry", "CARBON", -25)])
    assert merchant_balance(terminal) == 0
    refund = refund_create(payment=payment, amount=50)
    assert refund.fee == 50 and merchant_balance(terminal) == 0  # all of it from the fees account
    ledger_sound()


def test_captures_and_confirms_take_the_fee_of_what_they_charge(tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    merchant = terminal.store.merchant
    fund(customer, 10_000)
    schedule(merchant=merchant, rate="0.1", rounding=FeeRounding.HALF_EVEN, fixed=0)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=1_000, capture_method="manual")
    payment_intent_authorize(intent=intent)
    captured = payment_intent_capture(intent=intent, amount=625)  # 62.5 half even = 62
    assert captured.payment is not None and (captured.payment.fee, captured.payment.net) == (62, 563)
    assert ("fees", "JPY", 62) in legs_of(captured.payment.ledger_transaction_id)
    automatic = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=635)
    charged = payment_intent_confirm(intent=automatic)
    assert charged.payment is not None and (charged.payment.fee, charged.payment.net) == (64, 571)  # 63.5 half even = 64
    assert merchant_balance(terminal) == 563 + 571
    ledger_sound()


# --- refunds -------------------------------------------------------------------------------


def test_partial_refunds_give_back_the_fee_in_proportion_and_all_of_it_at_the_end(tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    schedule(rate="0.03", rounding=FeeRounding.HALF_UP, fixed=5)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_001)  # fee 35
    fees_before = fees_balance()
    parts = [1, 2, 3, 100, 143, 143, 200, 7, 400, 2]
    assert sum(parts) == 1_001
    returned = 0
    for part in parts:
        merchant_before = merchant_balance(terminal)
        refund = refund_create(payment=payment, amount=part)
        expected = 35 * (payment.amount_refunded) // 1_001 - returned
        assert refund.fee == expected and 0 <= refund.fee <= part
        assert merchant_balance(terminal) == merchant_before - (part - refund.fee)
        assert ("fees", "JPY", -refund.fee) in legs_of(refund.ledger_transaction_id) or refund.fee == 0
        returned += refund.fee
        assert returned <= 35
    assert returned == 35 and Payment.objects.get(pk=payment.pk).fee_refunded == 35
    assert fees_balance() == fees_before - 35 and merchant_balance(terminal) == 0
    assert [e.payload["fee"] for e in OutboxEvent.objects.filter(topic="refund.succeeded", payload__payment=payment.pk).order_by("created")] == [
        r.fee for r in Refund.objects.filter(payment=payment).order_by("created")
    ]
    ledger_sound()


def test_with_the_policy_none_a_refund_keeps_the_fee(tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    schedule(rate="0.1", fixed=0)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)  # fee 100, net 900
    fund(merchant=terminal.store.merchant, amount=100)  # the merchant gives back the whole amount
    monkeypatch.setattr(tenant, "refund_fee_policy", "none")
    fees_before = fees_balance()
    refund = refund_create(payment=payment, amount=400)
    assert refund.fee == 0 and fees_balance() == fees_before and merchant_balance(terminal) == 1_000 - 400
    monkeypatch.setattr(tenant, "refund_fee_policy", "proportional")
    last = refund_create(payment=payment, amount=600)  # its own share only: the first refund's stays kept
    assert last.fee == 60 and Payment.objects.get(pk=payment.pk).fee_refunded == 60
    assert fees_balance() == fees_before - 60 and merchant_balance(terminal) == 600 - 540
    ledger_sound()


# --- reconciliation --------------------------------------------------------------------------


@pytest.mark.parametrize("tampered", ["payment fee", "fees account"])
def test_the_reconciliation_check_catches_a_tampered_fee(tenant: Tenant, tampered: str) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    schedule(rate="0.05", fixed=0)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)
    refund_create(payment=payment, amount=300)
    ledger_sound()
    if tampered == "payment fee":
        Payment.objects.filter(pk=payment.pk).update(fee=40)
    else:
        row = Balance.objects.filter(account__system_role=SystemRole.FEES, asset_id="JPY").order_by("shard").first()
        assert row is not None
        Balance.objects.filter(pk=row.pk).update(balance=row.balance + 7)
    [finding] = fee_account_check(CheckContext(now=timezone.now()))
    assert finding.kind == "fee_account_mismatch" and finding.details["asset"] == "JPY"
    assert finding.details["difference"] == (10 if tampered == "payment fee" else 7)


# --- concurrency ---------------------------------------------------------------------------


def test_concurrent_payments_and_partial_refunds_leave_every_fee_exact(live_tenant: Tenant) -> None:
    """Payments from many wallets to one merchant with a fee at once, then each refunded in
    three parts at once: every fee is whole, every refunded fee whole, the merchant back at
    zero and the fees account's share exact, with no deadlock. Committed, so the schedule is
    the merchant's own (a tenant-wide one would reach the other tests)."""
    merchant = MerchantFactory()
    terminal = TerminalFactory(store=StoreFactory(merchant=merchant))
    schedule(merchant=merchant, rate="0.037", rounding=FeeRounding.CEILING, fixed=3)
    customers = [CustomerFactory() for _ in range(8)]
    for customer in customers:
        fund(customer, 5_000)
    deadlocks = _deadlocks_retried()

    paid = _race(live_tenant, [
        (lambda c=c, i=i: payment_create(terminal=terminal, customer=c, asset_code="JPY", amount=1_000 + 37 * i))  # type: ignore[misc]
        for i, c in enumerate(customers)
    ])
    payments = [value for status, value in paid if status == "ok"]
    assert len(payments) == len(customers), paid
    for p in payments:
        assert p.fee == fee_for(amount=p.amount, rate=Decimal("0.037"), rounding=FeeRounding.CEILING, fixed=3) > 0
    assert merchant_balance(terminal) == sum(p.net for p in payments)

    parts = [(p, share) for p in payments for share in (p.amount // 3, p.amount // 3, p.amount - 2 * (p.amount // 3))]
    refunded = _race(live_tenant, [(lambda p=p, s=s: refund_create(payment=p, amount=s)) for p, s in parts])  # type: ignore[misc]
    assert all(status == "ok" for status, _ in refunded), refunded
    stored = Payment.objects.filter(pk__in=[p.pk for p in payments])
    assert all(p.fee_refunded == p.fee and p.amount_refunded == p.amount for p in stored)
    assert merchant_balance(terminal) == 0
    refunds = list(Refund.objects.filter(payment__in=stored))
    assert sum(r.fee for r in refunds) == sum(p.fee for p in payments)
    transactions = [p.ledger_transaction_id for p in payments] + [r.ledger_transaction_id for r in refunds]
    fee_legs = LedgerEntry.objects.filter(account__system_role=SystemRole.FEES, transaction_id__in=transactions).values_list("amount", flat=True)
    assert sorted(a for a in fee_legs if a > 0) == sorted(p.fee for p in payments) and sum(fee_legs) == 0
    assert _deadlocks_retried() == deadlocks
    assert list(fee_account_check(CheckContext(now=timezone.now()))) == []

