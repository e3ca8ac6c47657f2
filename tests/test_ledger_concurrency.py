"""Contention on real PostgreSQL with real threads (one connection per thread).

Uses `live_tenant`: rows commit, so every thread sees them; each test makes its own
uniquely-named parties and leaves them in the throwaway test database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from payments import selectors
from payments.models import OutboxEvent, Payment, PaymentIntent
from payments.services.charges import payment_create
from payments.services.intents import (
    payment_intent_authorize,
    payment_intent_cancel,
    payment_intent_capture,
    payment_intent_confirm,
    payment_intent_create,
)
from payments.services.refunds import refund_create
from payments.services.transfers import transfer_create
from tenants.models import Tenant
from tests.conftest import run_in_thread_tenant
from tests.factories import CustomerFactory, MerchantFactory, StoreFactory, TerminalFactory, fund, staff
from wallets import metrics
from wallets.errors import InsufficientFunds, InvalidState
from wallets.models import Balance, LedgerEntry
from wallets.selectors import balance_entry_mismatches, ledger_orphan_references, ledger_unbalanced_transactions


def _race(tenant: Tenant, jobs: list[Callable[[], Any]]) -> list[tuple[str, Any]]:
    """Start every job at the same moment, each on its own thread and connection."""
    barrier = threading.Barrier(len(jobs))
    results: list[tuple[str, Any]] = [("missing", None)] * len(jobs)

    def run(index: int, job: Callable[[], Any]) -> None:
        def body() -> Any:
            barrier.wait()
            return job()

        try:
            results[index] = ("ok", run_in_thread_tenant(tenant, body))
        except Exception as exc:
            results[index] = ("error", exc)

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


def _deadlocks_retried() -> float:
    """Deadlocks run_atomic has retried so far (a retried deadlock never reaches the caller,
    so the tests look here to prove there was none)."""
    return sum(
        sample.value
        for metric in metrics.TRANSACTION_CONFLICT_RETRIES.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("reason") == "deadlock"
    )


def _jpy(customer: Any) -> dict[str, int]:
    return next(dict(line) for line in selectors.wallet_balances(customer=customer) if line["asset"] == "JPY")


def test_fifty_concurrent_payments_of_ten_from_a_hundred(live_tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 100)
    results = _race(live_tenant, [lambda: payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=10)] * 50)
    successes = [value for status, value in results if status == "ok"]
    failures = [value for status, value in results if status == "error"]
    assert len(successes) == 10
    assert len(failures) == 40 and all(isinstance(exc, InsufficientFunds) for exc in failures), failures[:3]
    assert _jpy(customer)["balance"] == 0
    assert Payment.objects.filter(customer=customer).count() == 10
    assert OutboxEvent.objects.filter(topic="payment.succeeded", payload__customer=customer.pk).count() == 10
    merchant_jpy = next(line for line in selectors.merchant_balances(merchant=terminal.store.merchant) if line["asset"] == "JPY")
    assert merchant_jpy["balance"] == 100


def test_opposite_transfers_at_once_never_surface_a_deadlock(live_tenant: Tenant) -> None:
    alice, bob = CustomerFactory(), CustomerFactory()
    fund(alice, 1_000)
    fund(bob, 1_000)

    def a_to_b() -> None:
        for _ in range(5):
            transfer_create(from_customer=alice, to_customer=bob, asset_code="JPY", amount=7)

    def b_to_a() -> None:
        for _ in range(5):
            transfer_create(from_customer=bob, to_customer=alice, asset_code="JPY", amount=3)

    deadlocks = _deadlocks_retried()
    results = _race(live_tenant, [a_to_b, b_to_a] * 8)
    assert [value for status, value in results if status == "error"] == []
    assert _deadlocks_retried() == deadlocks
    assert _jpy(alice)["balance"] == 1_000 - 8 * 5 * 7 + 8 * 5 * 3
    assert _jpy(bob)["balance"] == 1_000 + 8 * 5 * 7 - 8 * 5 * 3


def test_hot_merchant_many_payers_balance_exact(live_tenant: Tenant) -> None:
    store = StoreFactory(merchant=MerchantFactory())
    terminals = [TerminalFactory(store=store) for _ in range(2)]
    payers = [CustomerFactory() for _ in range(12)]
    for payer in payers:
        fund(payer, 1_000)

    def pay(index: int) -> Callable[[], None]:
        def run() -> None:
            for n in range(10):
                payment_create(terminal=terminals[n % 2], customer=payers[index], asset_code="JPY", amount=1 + index)

        return run

    results = _race(live_tenant, [pay(i) for i in range(len(payers))])
    assert [value for status, value in results if status == "error"] == []
    expected = sum(10 * (1 + i) for i in range(len(payers)))
    merchant_jpy = next(line for line in selectors.merchant_balances(merchant=store.merchant) if line["asset"] == "JPY")
    assert merchant_jpy["balance"] == expected
    assert Balance.objects.filter(account__merchant=store.merchant, asset_id="JPY").count() > 1  # spread over shards

    # Concurrent refunds against the sharded balance: each bounded by its payment, total exact.
    payments = list(Payment.objects.filter(merchant=store.merchant))
    results = _race(live_tenant, [lambda p=p: refund_create(payment=p, amount=p.amount) for p in payments[:12]])
    assert [value for status, value in results if status == "error"] == []
    refunded = sum(p.amount for p in payments[:12])
    merchant_jpy = next(line for line in selectors.merchant_balances(merchant=store.merchant) if line["asset"] == "JPY")
    assert merchant_jpy["balance"] == expected - refunded


def test_concurrent_refunds_never_exceed_the_payment(live_tenant: Tenant) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    results = _race(live_tenant, [lambda: refund_create(payment=payment, amount=30)] * 8)
    assert sum(1 for status, _ in results if status == "ok") == 3
    assert Payment.objects.get(pk=payment.pk).amount_refunded == 90


def test_concurrent_capture_and_cancel_do_exactly_one(live_tenant: Tenant) -> None:
    merchant = MerchantFactory()
    for _ in range(5):
        customer = CustomerFactory()
        fund(customer, 500)
        intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=300, capture_method="manual")
        payment_intent_authorize(intent=intent)
        assert _jpy(customer) == {"asset": "JPY", "balance": 500, "available": 200, "held": 300}
        snapshot = PaymentIntent.objects.get(pk=intent.pk)
        capture_copy, cancel_copy = PaymentIntent.objects.get(pk=intent.pk), PaymentIntent.objects.get(pk=intent.pk)
        results = _race(
            live_tenant,
            [lambda c=capture_copy: payment_intent_capture(intent=c, amount=200), lambda c=cancel_copy: payment_intent_cancel(intent=c)],
        )
        oks = [value for status, value in results if status == "ok"]
        errors = [value for status, value in results if status == "error"]
        assert len(oks) == 1 and len(errors) == 1 and isinstance(errors[0], InvalidState), results
        final = PaymentIntent.objects.get(pk=intent.pk)
        assert final.version == snapshot.version + 1
        balance = _jpy(customer)
        if final.status == "captured":
            assert balance == {"asset": "JPY", "balance": 300, "available": 300, "held": 0}
        else:
            assert final.status == "canceled"
            assert balance == {"asset": "JPY", "balance": 500, "available": 500, "held": 0}


def test_two_concurrent_confirms_charge_once(live_tenant: Tenant) -> None:
    merchant, customer = MerchantFactory(), CustomerFactory()
    fund(customer, 1_000)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=400)
    copies = [PaymentIntent.objects.get(pk=intent.pk) for _ in range(4)]
    results = _race(live_tenant, [lambda c=c: payment_intent_confirm(intent=c) for c in copies])
    assert sum(1 for status, _ in results if status == "ok") == 1
    assert PaymentIntent.objects.get(pk=intent.pk).status == "charged"
    assert Payment.objects.filter(customer=customer).count() == 1
    assert _jpy(customer)["balance"] == 600


def test_payments_refunds_and_transfers_of_the_same_wallets_at_once_never_deadlock(live_tenant: Tenant) -> None:
    store = StoreFactory(merchant=MerchantFactory())
    terminal = TerminalFactory(store=store)
    alice, bob = CustomerFactory(), CustomerFactory()
    fund(alice, 100_000)
    fund(bob, 100_000)
    earlier = [payment_create(terminal=terminal, customer=who, asset_code="JPY", amount=1_000) for who in (alice, bob) * 4]

    def pay(who: Any) -> Callable[[], None]:
        return lambda: [payment_create(terminal=terminal, customer=who, asset_code="JPY", amount=100) for _ in range(5)] and None

    def refund(payment: Payment) -> Callable[[], None]:
        return lambda: [refund_create(payment=payment, amount=100) for _ in range(5)] and None

    def transfer(source: Any, target: Any) -> Callable[[], None]:
        return lambda: [transfer_create(from_customer=source, to_customer=target, asset_code="POINT", amount=1) for _ in range(3)] and None

    jobs = [pay(alice), pay(bob), *(refund(p) for p in earlier), transfer(alice, bob), transfer(bob, alice)]
    deadlocks = _deadlocks_retried()
    results = _race(live_tenant, jobs)
    assert [value for status, value in results if status == "error"] == []
    assert _deadlocks_retried() == deadlocks
    assert ledger_unbalanced_transactions() == [] and balance_entry_mismatches() == []


def test_ledger_is_sound_after_the_races(live_tenant: Tenant) -> None:
    assert LedgerEntry.objects.exists()
    assert ledger_unbalanced_transactions() == []
    assert balance_entry_mismatches() == []
    assert ledger_orphan_references() == []


# pytest-django creates the test database only if some collected test is marked django_db;
# this one also keeps the file runnable on its own.
@pytest.mark.django_db
def test_authorization_beyond_available_is_refused(tenant: Tenant) -> None:
    customer, merchant = CustomerFactory(), MerchantFactory()
    fund(customer, 100)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=101, capture_method="manual")
    with pytest.raises(InsufficientFunds):
        payment_intent_authorize(intent=intent)
    assert PaymentIntent.objects.get(pk=intent.pk).status == "created"


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Any:
    before = threading.active_count()
    yield
    assert threading.active_count() <= before


def test_two_terminals_racing_one_payment_token_charge_once(live_tenant) -> None:  # type: ignore[no-untyped-def]
    import threading

    from payments.services.charges import payment_create_with_token
    from payments.services.tokens import payment_token_create
    from wallets.errors import NotFound

    customer, terminals = CustomerFactory(), [TerminalFactory(), TerminalFactory()]
    fund(customer, 10_000)
    _, raw = payment_token_create(customer=customer)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def pay(terminal) -> None:  # type: ignore[no-untyped-def]
        def body() -> None:
            barrier.wait()
            try:
                payment_create_with_token(terminal=terminal, customer_token=raw, asset_code="JPY", amount=1_000)
                outcomes.append("paid")
            except NotFound:
                outcomes.append("refused")

        run_in_thread_tenant(live_tenant, body)

    threads = [threading.Thread(target=pay, args=(t,)) for t in terminals]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["paid", "refused"]
    assert Payment.objects.filter(customer=customer).count() == 1


def test_refund_racing_a_points_spend_takes_back_what_is_left_instead_of_refusing(live_tenant) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    from django.db import transaction

    from payments.services.charges import payment_create
    from payments.services.refunds import refund_create
    from payments.services.transfers import transfer_create

    customer, friend, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)
    assert payment.points_earned == 10
    spend_locked, release_spend = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def spend() -> None:
        def body() -> None:
            with transaction.atomic():  # holds the customer's POINT row until released
                transfer_create(from_customer=customer, to_customer=friend, asset_code="POINT", amount=5)
                spend_locked.set()
                release_spend.wait(10)

        run_in_thread_tenant(live_tenant, body)

    def refund() -> None:
        def body() -> None:
            try:
                outcome["refund"] = refund_create(payment=payment, amount=1_000)
            except Exception as exc:
                outcome["error"] = exc

        run_in_thread_tenant(live_tenant, body)

    spender = threading.Thread(target=spend)
    spender.start()
    assert spend_locked.wait(10)
    refunder = threading.Thread(target=refund)
    refunder.start()
    time.sleep(0.5)  # the refund is now waiting on the customer's rows
    release_spend.set()
    spender.join(30)
    refunder.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["refund"].points_reversed == 5  # type: ignore[attr-defined]


@pytest.mark.parametrize("remembered", [False, True], ids=["plan-read", "accounts-remembered"])
def test_a_payment_waiting_on_a_freeze_is_refused_once_the_freeze_commits(live_tenant: Tenant, remembered: bool) -> None:
    """A payment that reaches the wallet's rows while a freeze holds them must not finish
    after the freeze commits (it would read the account row as it was before); also when
    the process remembers the payer's accounts from an earlier payment (no plan read)."""
    from django.db import connection, transaction

    from payments.services import charges
    from payments.services.freezes import wallet_freeze
    from wallets.errors import WalletFrozen

    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    paid_before = 0
    if remembered:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
        paid_before = 100
        assert any(key[1] == customer.pk for key in charges._KNOWN_ACCOUNTS)
    frozen_holding = threading.Event()
    release = threading.Event()
    outcome: dict[str, Any] = {}

    def freeze() -> None:
        def body() -> None:
            with transaction.atomic():
                wallet_freeze(customer=customer, staff=staff(), reason="fraud review")
                frozen_holding.set()
                release.wait(timeout=10)  # commit only once the payment is waiting on the rows

        run_in_thread_tenant(live_tenant, body)

    def pay() -> None:
        def body() -> None:
            try:
                outcome["payment"] = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
            except WalletFrozen as refused:
                outcome["refused"] = refused

        run_in_thread_tenant(live_tenant, body)

    freezer = threading.Thread(target=freeze)
    freezer.start()
    assert frozen_holding.wait(timeout=10)
    payer = threading.Thread(target=pay)
    payer.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the payment is blocked on the wallet's rows
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE %s",
                ["%wallets_balance%"],
            )
            row = cursor.fetchone()
        if row and row[0]:
            break
        time.sleep(0.05)
    release.set()
    freezer.join(timeout=20)
    payer.join(timeout=20)
    assert "refused" in outcome and "payment" not in outcome, outcome
    assert _jpy(customer)["balance"] == 1_000 - paid_before


def _between_plan_and_lock(monkeypatch: pytest.MonkeyPatch, tenant: Tenant, meddle: Callable[[], Any]) -> None:
    """Run `meddle` on another thread and connection, committed, right after the payment
    path has read its plan and before it writes and locks (payments.services.charges)."""
    from payments.services import charges

    read = charges.balance_rows_read_by_owner
    done: list[bool] = []

    def read_then_meddle(**kwargs: Any) -> Any:
        plan = read(**kwargs)
        if not done:
            done.append(True)
            worker = threading.Thread(target=run_in_thread_tenant, args=(tenant, meddle))
            worker.start()
            worker.join(timeout=30)
        return plan

    monkeypatch.setattr(charges, "balance_rows_read_by_owner", read_then_meddle)


def test_a_spend_between_the_plan_and_the_lock_is_refused_and_leaves_nothing(live_tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    """The payment path writes its rows before it locks; when the locked wallet no longer
    covers it, the refusal rolls those rows back (its savepoint), even inside a caller's
    transaction that carries on."""
    from django.db import transaction

    customer, terminal, other_terminal = CustomerFactory(), TerminalFactory(), TerminalFactory()
    fund(customer, 100)
    spent: list[Payment] = []
    _between_plan_and_lock(
        monkeypatch, live_tenant, lambda: spent.append(payment_create(terminal=other_terminal, customer=customer, asset_code="JPY", amount=60))
    )
    with transaction.atomic():
        before = (Payment.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count())
        with pytest.raises(InsufficientFunds):
            payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=50)
        # The caller's transaction is usable and holds nothing of the refused payment: only
        # the rows of the payment that spent the money meanwhile are new.
        assert len(spent) == 1 and not Payment.objects.filter(terminal_id=terminal.pk).exists()
        spent_entries = LedgerEntry.objects.filter(transaction_id=spent[0].ledger_transaction_id).count()
        assert spent_entries >= 2
        assert (Payment.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count()) == (
            before[0] + 1, before[1] + spent_entries, before[2] + 1
        )
    assert _jpy(customer)["balance"] == 40
    assert ledger_unbalanced_transactions() == [] and balance_entry_mismatches() == []


def test_a_reward_cap_reached_between_the_plan_and_the_lock_is_cut_on_the_locked_rows(
    live_tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan saw room for the whole reward; by the time the rows are locked another
    payment has used it. The payment is redone locking first and its reward cut to fit."""
    from wallets.models import Asset

    cap_before = Asset.objects.get(code="POINT").cap
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    try:
        Asset.objects.filter(code="POINT").update(cap=15)
        _between_plan_and_lock(monkeypatch, live_tenant, lambda: payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000))
        payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)
    finally:
        Asset.objects.filter(code="POINT").update(cap=cap_before)
    points = [p.points_earned for p in Payment.objects.filter(customer_id=customer.pk).order_by("created", "id")]
    assert sorted(points) == [5, 10], points  # 10 per 1,000 JPY: the first got 10, the second what was left
    assert payment.points_earned == 5
    assert next(line for line in selectors.wallet_balances(customer=customer) if line["asset"] == "POINT")["balance"] == 15
    assert Payment.objects.filter(customer_id=customer.pk).count() == 2
    assert ledger_unbalanced_transactions() == [] and balance_entry_mismatches() == []


def test_a_lock_timeout_after_the_payments_writes_leaves_nothing_in_the_callers_transaction(live_tenant: Tenant) -> None:
    """The payment path writes before it locks. When the lock is not granted (here: another
    connection holds the wallet's row past lock_timeout), the error reaches the caller
    with the payment's rows rolled back (its savepoint) and the caller's transaction
    usable, as a refusal does."""
    from django.db import OperationalError, connection, transaction

    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 100)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        def body() -> None:
            with transaction.atomic():
                list(Balance.objects.filter(account__customer_id=customer.pk, asset_id="JPY").order_by("pk").select_for_update())
                holding.set()
                release.wait(timeout=20)

        run_in_thread_tenant(live_tenant, body)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(timeout=10)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '200ms'")
            before = (Payment.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count())
            with pytest.raises(OperationalError):
                payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=10)
            assert (Payment.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count()) == before
    finally:
        release.set()
        holder.join(timeout=30)
    assert _jpy(customer)["balance"] == 100
