"""Ledger and payments service: correctness on real PostgreSQL (single-threaded)."""

from __future__ import annotations

import re
from datetime import datetime, time, timedelta
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apikit.errors import http_status_of
from payments import selectors
from payments.errors import RefundWindowClosed
from payments.models import OutboxEvent, Payment, Refund
from payments.selectors import payment_token_resolve
from payments.services.adjustments import adjustment_create
from payments.services.charges import payment_create
from payments.services.freezes import wallet_freeze, wallet_unfreeze
from payments.services.refunds import refund_create, terminal_refund_create
from payments.services.tokens import payment_token_create
from payments.services.topups import topup_create, topup_credit
from payments.services.transfers import transfer_create
from tests.conftest import statements_sent
from tests.factories import CustomerFactory, StoreFactory, TerminalFactory, fund, staff
from wallets.errors import AmountInvalid, AssetUnknown, CapExceeded, InsufficientFunds, NotFound, WalletFrozen
from wallets.models import Asset, LedgerEntry, LedgerTransaction
from wallets.selectors import (
    asset_totals,
    balance_entry_mismatches,
    ledger_orphan_references,
    ledger_unbalanced_transactions,
    unconstrained_references,
)

pytestmark = pytest.mark.django_db


def _balance(customer, asset="JPY") -> dict:  # type: ignore[no-untyped-def]
    return next(line for line in selectors.wallet_balances(customer=customer) if line["asset"] == asset)


def _assert_ledger_sound() -> None:
    assert ledger_unbalanced_transactions() == []
    assert ledger_orphan_references() == []
    assert balance_entry_mismatches() == []
    assert all(total == 0 for total in asset_totals().values())


def test_payment_moves_money_earns_points_and_carbon(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_001)
    assert payment.merchant_id == terminal.store.merchant_id and payment.store_id == terminal.store_id
    # Default rates: 0.01 point per yen (floor), 0.5 g per yen (half-even).
    assert payment.points_earned == 10
    assert payment.carbon_grams == 500  # 500.5 -> 500 (half-even)
    assert Payment.objects.get(pk=payment.pk).amount == 1_001
    assert _balance(customer)["balance"] == 8_999
    assert _balance(customer, "POINT")["balance"] == 10
    assert _balance(customer, "CARBON")["balance"] == 500
    merchant_jpy = next(b for b in selectors.merchant_balances(merchant=terminal.store.merchant) if b["asset"] == "JPY")
    assert merchant_jpy["balance"] == 1_001
    assert selectors.carbon_impact_grams(merchant=terminal.store.merchant) == 500
    assert OutboxEvent.objects.filter(topic="payment.succeeded", payload__id=payment.pk).count() == 1
    _assert_ledger_sound()


@pytest.mark.parametrize(("amount", "entries"), [(1, 2), (3, 4), (1_001, 6)])  # no reward, carbon only, both
def test_a_payment_s_batch_stays_within_psycopg_s_cached_statements(tenant, amount: int, entries: int) -> None:  # type: ignore[no-untyped-def]
    """psycopg converts a statement string once and caches it only while it has at most
    MAX_CACHED_STATEMENT_PARAMS parameters; past that it parses the whole string again on
    every execute. A payment's one batch (savepoint, ledger transaction, entries, payment,
    event) stays within it with or without rewards (fastpath.compiled.VALUES_ROWS_MAX)."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payments: list[Payment] = []
    sent = statements_sent(lambda: payments.append(payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=amount)))
    assert LedgerEntry.objects.filter(transaction_id=payments[0].ledger_transaction_id).count() == entries
    [(batch, params)] = [(sql, params) for sql, params in sent if "INSERT INTO \"wallets_ledgerentry\"" in sql]
    assert "payments_payment" in batch and "payments_outboxevent" in batch
    assert len(params) <= MAX_CACHED_STATEMENT_PARAMS and len(batch.encode()) <= MAX_CACHED_STATEMENT_LENGTH


def test_payment_is_an_orm_posting_that_writes_before_it_locks(tenant, settings) -> None:  # type: ignore[no-untyped-def]
    """The payment path is the ledger's one posting path, in the ORM, and keeps the wallet
    row locked for as little as it can: it reads its plan (the rows, accounts and assets,
    no lock), opens a savepoint and inserts the ledger transaction, entries, payment and
    event (five statements sent in one round trip: wallets.locks.rows_insert_in_savepoint), and only
    then locks every balance row with one statement in lock order and moves them with one
    F() update; last, one statement adds its legs to their accounts' daily totals (a new
    tenant keeps them from its start). No SQL function is involved. The next payment of the same parties in this
    process skips the plan read: it knows their accounts (payments.services.charges). (The
    staged-migration phase a posting asks for is read once per process and TTL, here by
    the warm-up payment.)"""
    from payments.services.charges import known_accounts_forget
    from wallets.staged.phases import staged_phase_forget

    settings.TALLY_STAGED_PHASE_TTL_SECONDS = 3600
    staged_phase_forget()
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)  # the reward and shard rows now exist
    known_accounts_forget()
    with CaptureQueriesContext(connection) as first:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    with CaptureQueriesContext(connection) as next_one:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    staged_phase_forget()

    def shape(one: str) -> tuple[str, str | None]:
        return one.split()[0], next((t for t in one.replace('"', " ").split() if t.startswith(("wallets_", "payments_"))), None)

    writes_then_locks = [
        [
            ("SAVEPOINT", None),
            ("INSERT", "wallets_ledgertransaction"),
            ("INSERT", "wallets_ledgerentry"),
            ("INSERT", "payments_payment"),
            ("INSERT", "payments_outboxevent"),
        ],
        [("SELECT", "wallets_balance")],
        [("UPDATE", "wallets_balance")],
        [("INSERT", "wallets_merchantdailytotal")],  # the table of every account's daily totals
    ]
    for queries, expected in [(first, [[("SELECT", "wallets_balance")], *writes_then_locks]), (next_one, writes_then_locks)]:
        # django-tenants re-issues SET search_path per cursor unless TENANT_LIMIT_SET_CALLS is on.
        statements = [q["sql"] for q in queries if not q["sql"].startswith("SET search_path")]
        # One entry per round trip; a round trip that carries several statements lists each.
        assert [[shape(one) for one in sql.split(";\n")] for sql in statements] == expected, statements
        assert statements[-3].rstrip().endswith('FOR UPDATE OF "wallets_balance"'), statements[-3]
        assert not any("tally_payment_create" in sql for sql in statements)
    plan = next(q["sql"] for q in first.captured_queries if not q["sql"].startswith("SET search_path"))
    assert "FOR UPDATE" not in plan, plan
    assert _balance(customer, "JPY")["balance"] == 10_000 - 300



def _written_counts() -> tuple[int, int, int, int]:
    return Payment.objects.count(), LedgerTransaction.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count()


def test_known_accounts_are_checked_on_the_locked_rows(tenant) -> None:  # type: ignore[no-untyped-def]
    """A payment of parties whose accounts the process remembers skips the plan read; the
    locked rows still decide: a freeze, short funds and a reward cap that came since are
    refused or cut as on the plan's path, with nothing written, and a refusal makes the
    next payment read its plan again."""
    from payments.services import charges

    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    mine = [key for key in charges._KNOWN_ACCOUNTS if key[1] == customer.pk]
    assert len(mine) == 1

    wallet_freeze(customer=customer, staff=staff(), reason="review")
    before = _written_counts()
    with pytest.raises(WalletFrozen), CaptureQueriesContext(connection) as refused:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    sent = [q["sql"] for q in refused.captured_queries if not q["sql"].startswith("SET search_path")]
    assert sent[0].startswith("SAVEPOINT") and "FOR UPDATE" in sent[1], sent  # no plan read: refused on the locked rows
    assert _written_counts() == before and mine[0] not in charges._KNOWN_ACCOUNTS
    wallet_unfreeze(customer=customer, staff=staff(), reason="cleared")
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)  # remembered again
    assert mine[0] in charges._KNOWN_ACCOUNTS

    with pytest.raises(InsufficientFunds), CaptureQueriesContext(connection) as refused:
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=801)
    sent = [q["sql"] for q in refused.captured_queries if not q["sql"].startswith("SET search_path")]
    assert sent[0].startswith("SAVEPOINT") and "FOR UPDATE" in sent[1], sent
    assert _written_counts()[0] == before[0] + 1 and mine[0] not in charges._KNOWN_ACCOUNTS
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    assert mine[0] in charges._KNOWN_ACCOUNTS

    # A points cap set since: the payment is redone locking first, its reward cut to fit.
    points = _balance(customer, "POINT")["balance"]
    Asset.objects.filter(code="POINT").update(cap=points + 1)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=400)
    assert payment.points_earned == 1 and _balance(customer, "POINT")["balance"] == points + 1
    assert _balance(customer, "JPY")["balance"] == 1_000 - 700
    _assert_ledger_sound()


def test_known_accounts_that_are_wrong_are_caught_before_any_money_moves(tenant) -> None:  # type: ignore[no-untyped-def]
    """Remembered accounts are a hint. Given another customer's (as a tenant restored
    under the same ids, or a bug, could), the payment still charges its own payer: the
    locked rows show whose accounts they are, the written rows go back, the entry is
    forgotten, and the payment is made locking first."""
    from payments.services import charges

    alice, bob, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    fund(alice, 1_000)
    fund(bob, 1_000)
    payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=100)
    payment_create(terminal=terminal, customer=bob, asset_code="JPY", amount=100)
    [alice_key] = [key for key in charges._KNOWN_ACCOUNTS if key[1] == alice.pk]
    [bob_key] = [key for key in charges._KNOWN_ACCOUNTS if key[1] == bob.pk]
    charges._KNOWN_ACCOUNTS[alice_key] = charges._KNOWN_ACCOUNTS[bob_key]
    payments_before = Payment.objects.count()

    payment = payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=250)

    assert payment.customer_id == alice.pk and Payment.objects.count() == payments_before + 1
    assert _balance(alice, "JPY")["balance"] == 1_000 - 350
    assert _balance(bob, "JPY")["balance"] == 1_000 - 100
    debited = LedgerEntry.objects.filter(transaction_id=payment.ledger_transaction_id, amount__lt=0)
    assert set(debited.values_list("account__customer_id", flat=True)) == {alice.pk, None}  # her JPY; the reward accounts
    assert alice_key not in charges._KNOWN_ACCOUNTS
    _assert_ledger_sound()
    assert balance_entry_mismatches() == []


def test_known_accounts_of_a_customer_rolled_back_are_refused_as_unknown(tenant) -> None:  # type: ignore[no-untyped-def]
    """Accounts remembered from a transaction that rolled back (the customer and its
    account never committed): the payment is refused as for any unknown customer, with
    nothing written and no balance row made."""
    from payments.services import charges
    from wallets.models import Balance

    terminal = TerminalFactory()
    with transaction.atomic():
        ghost = CustomerFactory()
        fund(ghost, 1_000)
        payment_create(terminal=terminal, customer=ghost, asset_code="JPY", amount=100)
        transaction.set_rollback(True)
    assert any(key[1] == ghost.pk for key in charges._KNOWN_ACCOUNTS)
    before, balances = _written_counts(), Balance.objects.count()
    with pytest.raises(NotFound):
        payment_create(terminal=terminal, customer=ghost, asset_code="JPY", amount=100)
    assert _written_counts() == before and Balance.objects.count() == balances

def test_insufficient_funds_changes_nothing(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 100)
    before = (Payment.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count())
    with pytest.raises(InsufficientFunds):
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=101)
    assert (Payment.objects.count(), LedgerEntry.objects.count(), OutboxEvent.objects.count()) == before
    assert _balance(customer)["balance"] == 100


@pytest.mark.parametrize("bad", [0, -1, 10**15 + 1, True, "10", None, Decimal("1.5"), Decimal("NaN"), [], Decimal("-3")])
def test_bad_amounts_are_refused_and_change_nothing(tenant, bad) -> None:  # type: ignore[no-untyped-def]
    customer, other, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    before = (LedgerTransaction.objects.count(), OutboxEvent.objects.count())
    for call in (
        lambda: payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=bad),
        lambda: transfer_create(from_customer=customer, to_customer=other, asset_code="JPY", amount=bad),
        lambda: topup_create(customer=customer, asset_code="JPY", amount=bad, payment_method="card"),
        lambda: adjustment_create(staff=staff(), customer=customer, asset_code="JPY", amount=bad, direction="credit", reason="x"),
    ):
        with pytest.raises(AmountInvalid) as info:
            call()
        assert info.value.param == "amount"
    assert (LedgerTransaction.objects.count(), OutboxEvent.objects.count()) == before
    assert _balance(customer)["balance"] == 1_000


def test_float_amounts_raise_type_error_and_change_nothing(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, other, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    before = LedgerTransaction.objects.count()
    with pytest.raises(TypeError):
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=10.0)
    with pytest.raises(TypeError):
        transfer_create(from_customer=customer, to_customer=other, asset_code="JPY", amount=1.0)
    assert LedgerTransaction.objects.count() == before
    assert _balance(customer)["balance"] == 1_000


def test_integral_decimal_is_accepted(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    assert payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=Decimal("250")).amount == 250


def test_unknown_asset_is_refused(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, other, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    with pytest.raises(AssetUnknown):
        payment_create(terminal=terminal, customer=customer, asset_code="XYZ", amount=1)
    with pytest.raises(AssetUnknown):
        transfer_create(from_customer=customer, to_customer=other, asset_code="XYZ", amount=1)


def test_refunds_partial_repeated_bounded_and_return_rewards_in_proportion(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)  # 10 points, 500 g
    first = refund_create(payment=payment, amount=300, reason="broken cup")
    assert (first.points_reversed, first.carbon_grams_reversed) == (3, 150)
    with pytest.raises(AmountInvalid):
        refund_create(payment=payment, amount=701)
    second = refund_create(payment=payment, amount=700)
    assert (second.points_reversed, second.carbon_grams_reversed) == (7, 350)
    with pytest.raises(AmountInvalid):
        refund_create(payment=payment, amount=1)
    assert _balance(customer)["balance"] == 10_000
    assert _balance(customer, "POINT")["balance"] == 0
    assert selectors.carbon_impact_grams(customer=customer) == 0
    assert Payment.objects.get(pk=payment.pk).amount_refunded == 1_000
    _assert_ledger_sound()


def test_terminal_refund_create_same_store_same_day_only(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    same_merchant_other_store = TerminalFactory(store=StoreFactory(merchant=terminal.store.merchant))
    fund(customer, 1_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=600)
    refund = terminal_refund_create(terminal=terminal, payment_id=payment.id, amount=100, reason="wrong item")
    assert (refund.payment_id, refund.amount, refund.reason) == (payment.id, 100, "wrong item")
    assert _balance(customer)["balance"] == 500
    # Another store's (even the same merchant's) or an unknown payment: not found, alike.
    for other, payment_id in ((same_merchant_other_store, payment.id), (TerminalFactory(), payment.id), (terminal, "pay_nope")):
        with pytest.raises(NotFound) as missing:
            terminal_refund_create(terminal=other, payment_id=payment_id, amount=1)
        assert missing.value.param == "payment"
    # Today is the current time zone's calendar day: from its midnight on, not a moment before.
    midnight = timezone.make_aware(datetime.combine(timezone.localdate(), time.min))
    Payment.objects.filter(pk=payment.pk).update(created=midnight)
    terminal_refund_create(terminal=terminal, payment_id=payment.id, amount=100)
    for created in (midnight - timedelta(microseconds=1), timezone.now() - timedelta(days=2)):
        Payment.objects.filter(pk=payment.pk).update(created=created)
        with pytest.raises(RefundWindowClosed) as closed:
            terminal_refund_create(terminal=terminal, payment_id=payment.id, amount=100)
        assert (http_status_of(closed.value)[0], closed.value.code, closed.value.param) == (409, "refund_window_closed", "payment")
    assert Refund.objects.filter(payment_id=payment.id).count() == 2
    assert Payment.objects.get(pk=payment.pk).amount_refunded == 200
    # The merchant's back office still can.
    refund_create(payment=Payment.objects.get(pk=payment.pk), amount=100)
    _assert_ledger_sound()


def test_transfer_and_frozen_wallets(tenant) -> None:  # type: ignore[no-untyped-def]
    alice, bob, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    fund(alice, 500)
    transfer_create(from_customer=alice, to_customer=bob, asset_code="JPY", amount=200)
    assert (_balance(alice)["balance"], _balance(bob)["balance"]) == (300, 200)
    wallet_freeze(customer=alice, staff=staff(), reason="fraud check")
    with pytest.raises(WalletFrozen):
        payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=1)
    with pytest.raises(WalletFrozen):
        transfer_create(from_customer=bob, to_customer=alice, asset_code="JPY", amount=1)
    wallet_unfreeze(customer=alice, staff=staff())
    payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=1)
    _assert_ledger_sound()


def test_cap_is_enforced_on_credits(tenant) -> None:  # type: ignore[no-untyped-def]
    Asset.objects.update_or_create(code="LOCAL", defaults={"name": "Local", "kind": "regional", "cap": 1_000})
    alice, bob = CustomerFactory(), CustomerFactory()
    fund(alice, 1_000, asset="LOCAL")
    fund(bob, 900, asset="LOCAL")
    with pytest.raises(CapExceeded):
        transfer_create(from_customer=alice, to_customer=bob, asset_code="LOCAL", amount=101)
    with pytest.raises(CapExceeded):
        fund(bob, 101, asset="LOCAL")
    transfer_create(from_customer=alice, to_customer=bob, asset_code="LOCAL", amount=100)
    assert _balance(bob, "LOCAL")["balance"] == 1_000
    _assert_ledger_sound()


def test_topup_credit_with_bonus_is_idempotent(tenant) -> None:  # type: ignore[no-untyped-def]
    tenant.topup_bonus_rate = Decimal("0.05")
    try:
        customer = CustomerFactory()
        topup = topup_create(customer=customer, asset_code="JPY", amount=1_000, payment_method="card")
        assert (topup.status, topup.bonus_amount) == ("pending", 50)
        topup_credit(topup=topup)
        topup_credit(topup=topup)
        assert _balance(customer)["balance"] == 1_050
    finally:
        tenant.topup_bonus_rate = Decimal("0")
    _assert_ledger_sound()


def test_payment_tokens(tenant) -> None:  # type: ignore[no-untyped-def]
    customer = CustomerFactory()
    token, raw = payment_token_create(customer=customer)
    assert raw not in token.token_hash and raw.startswith("ptok_")
    assert payment_token_resolve(token=raw) == customer
    for bad in ("ptok_nope", "", None, "x" * 500):
        with pytest.raises(NotFound):
            payment_token_resolve(token=bad)


@pytest.mark.parametrize("statement", ["UPDATE wallets_ledgerentry SET amount = amount + 1", "DELETE FROM wallets_ledgerentry",
                                       "UPDATE wallets_ledgertransaction SET reference = 'x'", "DELETE FROM wallets_ledgertransaction"])
def test_database_refuses_update_and_delete_on_the_ledger(tenant, statement) -> None:  # type: ignore[no-untyped-def]
    customer = CustomerFactory()
    fund(customer, 10)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement)
    assert LedgerEntry.objects.filter(account__customer=customer, amount=10).exists()


# --- References without database foreign keys (wallets/0006) ---------------------------

# The relations the hot tables keep without a database foreign key, and what they point at.
UNCONSTRAINED = [
    ("payments_payment", "asset_id", "wallets_asset", "code"),
    ("payments_payment", "customer_id", "wallets_customer", "id"),
    ("payments_payment", "ledger_transaction_id", "wallets_ledgertransaction", "id"),
    ("payments_payment", "merchant_id", "wallets_merchant", "id"),
    ("payments_payment", "store_id", "wallets_store", "id"),
    ("payments_payment", "terminal_id", "wallets_terminal", "id"),
    ("wallets_ledgerentry", "account_id", "wallets_account", "id"),
    ("wallets_ledgerentry", "asset_id", "wallets_asset", "code"),
    ("wallets_ledgerentry", "transaction_id", "wallets_ledgertransaction", "id"),
    ("wallets_merchantdailytotal", "account_id", "wallets_account", "id"),
    ("wallets_merchantdailytotal", "asset_id", "wallets_asset", "code"),
]


def test_unconstrained_references_are_the_known_ones_and_every_target_is_guarded(tenant) -> None:  # type: ignore[no-untyped-def]
    assert unconstrained_references() == UNCONSTRAINED
    with connection.cursor() as cursor:
        # The database really has no foreign key on them (else the list above is stale).
        cursor.execute(
            "SELECT c.conrelid::regclass::text, a.attname FROM pg_constraint c "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
            "WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace"
        )
        constrained = set(cursor.fetchall())
        assert not constrained & {(table, column) for table, column, _, _ in UNCONSTRAINED}
        # Every table they point at refuses DELETE in the database itself.
        cursor.execute(
            "SELECT DISTINCT t.tgrelid::regclass::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE NOT t.tgisinternal AND t.tgtype & 8 = 8 "  # 8: fires on DELETE
            "AND p.proname IN ('tally_referenced_row_guard', 'tally_ledger_append_only') "
            "AND p.pronamespace = current_schema()::regnamespace AND t.tgrelid::regclass::text = ANY (%s)",
            [sorted({target for _, _, target, _ in UNCONSTRAINED})],
        )
        assert {row[0] for row in cursor.fetchall()} == {target for _, _, target, _ in UNCONSTRAINED}


def _guarded_rows() -> dict[str, tuple[str, str]]:
    """(primary key column, value) of one fresh row per guarded table."""
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 10)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1)
    Asset.objects.create(code="GUARDED", name="Unused asset", kind="regional")
    return {
        "wallets_account": ("id", customer.account.id),
        "wallets_asset": ("code", "GUARDED"),
        "wallets_customer": ("id", customer.id),
        "wallets_merchant": ("id", terminal.store.merchant_id),
        "wallets_store": ("id", terminal.store_id),
        "wallets_terminal": ("id", terminal.id),
        "wallets_ledgertransaction": ("id", payment.ledger_transaction_id),
    }


@pytest.mark.parametrize("table", ["wallets_account", "wallets_asset", "wallets_customer", "wallets_merchant", "wallets_store",
                                   "wallets_terminal", "wallets_ledgertransaction"])
def test_database_refuses_to_delete_or_rekey_a_referenced_row(tenant, table) -> None:  # type: ignore[no-untyped-def]
    pk, value = _guarded_rows()[table]
    # The message of the trigger, not the one of a foreign key that may also refuse.
    refused = "append-only" if table == "wallets_ledgertransaction" else "referenced row: DELETE"
    with pytest.raises(DatabaseError, match=refused), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{table}" WHERE "{pk}" = %s', [value])
    refused = "append-only" if table == "wallets_ledgertransaction" else "referenced row: UPDATE"
    with pytest.raises(DatabaseError, match=refused), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'UPDATE "{table}" SET "{pk}" = %s WHERE "{pk}" = %s', ["X" + value[1:], value])
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{table}" WHERE "{pk}" = %s', [value])
        assert cursor.fetchone()[0] == 1
    # Other columns stay editable (only the key is frozen).
    if table == "wallets_customer":
        with connection.cursor() as cursor:
            cursor.execute('UPDATE wallets_customer SET name = %s WHERE id = %s', ["Renamed", value])
            assert cursor.rowcount == 1


def test_orphan_references_are_reported(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 100)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=40)
    assert ledger_orphan_references() == []

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        with connection.cursor() as cursor:
            # An entry on an account that does not exist, in a transaction that does not
            # exist, of an asset that does not exist; and a payment pointing at nothing.
            cursor.execute(
                "INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created) "
                "VALUES ('ltx_missing', 'acc_missing', 'NOPE', 5, now())"
            )
            cursor.execute(
                "INSERT INTO payments_payment (id, status, customer_id, merchant_id, store_id, terminal_id, asset_id, amount, "
                "amount_refunded, points_earned, points_reversed, carbon_grams, carbon_grams_reversed, ledger_transaction_id, created) "
                "SELECT 'pay_orphan', status, 'cus_missing', 'mer_missing', 'sto_missing', 'ter_missing', 'NOPE', amount, 0, 0, 0, 0, 0, "
                "'ltx_missing', created FROM payments_payment WHERE id = %s",
                [payment.id],
            )
        assert ledger_orphan_references() == [
            ("payments_payment", "asset_id", "NOPE"),
            ("payments_payment", "customer_id", "cus_missing"),
            ("payments_payment", "ledger_transaction_id", "ltx_missing"),
            ("payments_payment", "merchant_id", "mer_missing"),
            ("payments_payment", "store_id", "sto_missing"),
            ("payments_payment", "terminal_id", "ter_missing"),
            ("wallets_ledgerentry", "account_id", "acc_missing"),
            ("wallets_ledgerentry", "asset_id", "NOPE"),
            ("wallets_ledgerentry", "transaction_id", "ltx_missing"),
        ]
        raise Rollback
    assert ledger_orphan_references() == []
    _assert_ledger_sound()


def test_demo_starting_balances_are_funded_once(tenant) -> None:  # type: ignore[no-untyped-def]
    from devtools.demo_seed import DEMO_STARTING_BALANCES, _demo_balances_ensure

    customers = {"alice": CustomerFactory(), "bob": CustomerFactory()}
    _demo_balances_ensure(customers=customers)
    _demo_balances_ensure(customers=customers)
    for label, customer in customers.items():
        assert _balance(customer)["balance"] == DEMO_STARTING_BALANCES[label]
    _assert_ledger_sound()


def test_merchant_adjustment_debit_is_bounded_by_the_sharded_balance(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    merchant = terminal.store.merchant
    fund(customer, 1_000)
    for _ in range(5):
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
    with pytest.raises(InsufficientFunds):
        adjustment_create(staff=staff(), merchant=merchant, asset_code="JPY", amount=501, direction="debit", reason="fee")
    adjustment_create(staff=staff(), merchant=merchant, asset_code="JPY", amount=500, direction="debit", reason="fee")
    assert next(b for b in selectors.merchant_balances(merchant=merchant) if b["asset"] == "JPY")["balance"] == 0
    _assert_ledger_sound()


def test_ledger_entries_for_customer_filter_and_order(tenant) -> None:  # type: ignore[no-untyped-def]
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=200)
    entries = list(selectors.ledger_entries_for_customer(customer=customer))
    assert len(entries) == 4
    assert {(e.asset_id, e.amount) for e in entries[:3]} == {("JPY", -200), ("POINT", 2), ("CARBON", 100)}
    assert (entries[3].asset_id, entries[3].amount) == ("JPY", 1_000)
    keys = [(e.created, e.id) for e in entries]
    assert keys == sorted(keys, reverse=True)
    jpy = list(selectors.ledger_entries_for_customer(customer=customer, asset_code="JPY", newest_first=False))
    assert [e.amount for e in jpy] == [1_000, -200]
    later = list(selectors.ledger_entries_for_customer(customer=customer, created_gte=entries[0].created))
    assert {e.transaction_id for e in later} == {entries[0].transaction_id}


def test_ids_are_long_random_and_alphanumeric() -> None:
    from wallets import ids

    tokens = {ids.random_token(24) for _ in range(2_000)}
    assert len(tokens) == 2_000
    assert all(len(t) == 24 and t.isascii() and t.isalnum() for t in tokens)
    assert len(set("".join(tokens))) == 62


def test_every_movement_locks_its_balance_rows_with_one_statement(tenant) -> None:  # type: ignore[no-untyped-def]
    """Deadlock freedom rests on this (wallets/locks.py): a transaction takes all the balance
    rows it needs in ONE ordered SELECT .. FOR UPDATE, and never a second time."""
    from payments.services.intents import payment_intent_authorize, payment_intent_cancel, payment_intent_capture, payment_intent_create

    customer, other, terminal = CustomerFactory(), CustomerFactory(), TerminalFactory()
    merchant = terminal.store.merchant
    fund(customer, 10_000)
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)
    held = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=500, capture_method="manual")
    released = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=100, capture_method="manual")
    payment_intent_authorize(intent=released)
    movements = {
        "payment": lambda: payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100),
        "refund": lambda: refund_create(payment=payment, amount=300),
        "transfer": lambda: transfer_create(from_customer=customer, to_customer=other, asset_code="JPY", amount=50),
        "top-up credit": lambda: topup_credit(topup=topup_create(customer=customer, asset_code="JPY", amount=100, payment_method="card")),
        "adjustment": lambda: fund(customer, 10),
        "authorize": lambda: payment_intent_authorize(intent=held),
        "capture": lambda: payment_intent_capture(intent=held, amount=200),
        "cancel": lambda: payment_intent_cancel(intent=released),
    }
    for name, movement in movements.items():
        with CaptureQueriesContext(connection) as queries:
            movement()
        locks = [q["sql"] for q in queries if 'FOR UPDATE OF "wallets_balance"' in q["sql"]]
        assert len(locks) == 1, (name, locks)
        # The lock leaves the joined rows' unread columns out; reading one would load it here.
        deferred_load = re.compile(r'SELECT "wallets_(account|asset)"\."(id|code)", "wallets_\1"\."created" FROM')
        deferred_loads = [q["sql"] for q in queries if deferred_load.match(q["sql"])]
        assert deferred_loads == [], (name, deferred_loads)
        assert locks[0].rstrip().endswith('ORDER BY "wallets_balance"."account_id" ASC, "wallets_balance"."asset_id" ASC, '
                                          '"wallets_balance"."shard" ASC FOR UPDATE OF "wallets_balance"'), (name, locks[0])
    _assert_ledger_sound()


def test_an_asset_added_later_gives_every_account_its_row_and_payments_lock_once(tenant) -> None:  # type: ignore[no-untyped-def]
    from wallets.models import AssetKind
    from wallets.services.ledger import asset_create

    customer, terminal = CustomerFactory(), TerminalFactory()
    asset_create(code="LOC", name="Local", kind=AssetKind.REGIONAL)
    fund(customer, 1_000, asset="LOC")
    with CaptureQueriesContext(connection) as queries:
        payment_create(terminal=terminal, customer=customer, asset_code="LOC", amount=100)
    locks = [q["sql"] for q in queries if 'FOR UPDATE OF "wallets_balance"' in q["sql"]]
    made = [q["sql"] for q in queries if q["sql"].startswith('INSERT INTO "wallets_balance"')]
    assert (len(locks), len(made)) == (1, 0)
    assert _balance(customer, "LOC")["balance"] == 900
    _assert_ledger_sound()


def test_a_frozen_wallet_paying_in_an_unknown_asset_is_told_the_asset_is_unknown(tenant) -> None:  # type: ignore[no-untyped-def]
    """The refusal order of the payment path: unknown asset (400, not stored) before a frozen
    wallet (402, stored and replayed), as the PL/pgSQL function had it."""
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 1_000)
    wallet_freeze(customer=customer, staff=staff(), reason="review")
    with pytest.raises(AssetUnknown):
        payment_create(terminal=terminal, customer=customer, asset_code="XYZ", amount=1)
    with pytest.raises(WalletFrozen):
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1)


def test_balance_rows_backfill_gives_old_accounts_their_rows(tenant) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from django.core.management import call_command

    from wallets.models import BALANCE_SHARDS, Account, AccountKind, Balance, Customer, Merchant

    # Accounts made the way they were before balance rows came with the account.
    old_customer = Customer.objects.create(name="Old")
    Account.objects.create(kind=AccountKind.CUSTOMER, customer=old_customer)
    old_merchant = Merchant.objects.create(name="Old shop")
    Account.objects.create(kind=AccountKind.MERCHANT, merchant=old_merchant)
    assets = Asset.objects.count()
    out = StringIO()
    call_command("balance_rows_backfill", tenant=tenant.schema_name, batch=7, stdout=out)
    assert Balance.objects.filter(account__customer=old_customer).count() == assets
    assert Balance.objects.filter(account__merchant=old_merchant).count() == assets * BALANCE_SHARDS
    assert f"{tenant.schema_name}: done" in out.getvalue()
    call_command("balance_rows_backfill", tenant=tenant.schema_name, stdout=StringIO())  # again: nothing changes
    assert Balance.objects.filter(account__customer=old_customer).count() == assets


def test_a_frozen_wallet_is_refused_before_short_funds_whatever_the_row_order(tenant) -> None:  # type: ignore[no-untyped-def]
    """Refusals come in the documented order (WalletFrozen before InsufficientFunds) when
    the accounts in the legs were read before a freeze (the payment path's plan is such a
    read) and the short row comes before the frozen one: the locked rows decide."""
    from wallets.selectors import account_of
    from wallets.services.ledger import Leg, ledger_post

    short, frozen = CustomerFactory(), CustomerFactory()
    fund(short, 10)
    short_account, frozen_account = account_of(party=short), account_of(party=frozen)  # read before the freeze
    wallet_freeze(customer=frozen, staff=staff(), reason="review")
    assert not frozen_account.frozen
    with pytest.raises(WalletFrozen):
        ledger_post(kind="transfer", reference="stale-plan", legs=[Leg(short_account, "JPY", -50), Leg(frozen_account, "JPY", 50)])
    assert _balance(short)["balance"] == 10
