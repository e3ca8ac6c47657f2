"""A merchant's funds: `available` and `pending` by the settlement delay, from the daily
totals or, until a tenant reads them, from the window's ledger entries (both must agree);
a failed or canceled payout's money coming back is available at once on both."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django import forms
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payments.admin import SettlementDelayForm
from payments.services import payouts
from tenants.models import Tenant
from tests.factories import MerchantFactory
from wallets.daily_totals import MIGRATION as TOTALS
from wallets.errors import InsufficientFunds, InvalidRequest
from wallets.locks import ALL_SHARDS, BalanceWant, balance_rows_lock
from wallets.models import Account, Balance, Merchant, StagedMigrationState, StagedPhase, SystemRole
from wallets.selectors import MerchantFunds, merchant_funds, merchant_recent_credits, merchant_settlement_delay_days
from wallets.services.ledger import Leg, ledger_post
from wallets.services.principals import merchant_settlement_delay_set
from wallets.staged.phases import staged_phase_forget

pytestmark = pytest.mark.django_db
# Postings write the daily totals in every phase used here; reads take the summary only
# from reads_switched on, the window's ledger entries before.
PATHS = {"ledger": StagedPhase.VERIFIED, "summary": StagedPhase.READS_SWITCHED}


@contextmanager
def _reading(path: str) -> Iterator[None]:
    StagedMigrationState.objects.update_or_create(name=TOTALS, defaults={"phase": PATHS[path]})
    staged_phase_forget()
    try:
        yield
    finally:
        staged_phase_forget()


def _post(account: Account, amount: int, created: datetime) -> None:
    """A credit (> 0) or a debit (< 0) of the merchant, against the adjustments account."""
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    ledger_post(kind="adjustment", reference="adj_test", legs=[Leg(account, "JPY", amount), Leg(source, "JPY", -amount)], created=created)


def _payout_back(account: Account, amount: int, created: datetime) -> None:
    """A failed payout's money back to the merchant from payouts in transit, as the saga posts it."""
    in_transit = Account.objects.get(system_role=SystemRole.PAYOUTS_IN_TRANSIT)
    ledger_post(kind="payout_back", reference="po_test", legs=[Leg(account, "JPY", amount), Leg(in_transit, "JPY", -amount)], created=created)


def _payout_view(merchant: Merchant, now: datetime) -> int:
    """What a payout made now may take: payout creation's own read, on the rows it locks."""
    account = Account.objects.get(merchant_id=merchant.pk)
    with transaction.atomic():
        locked = balance_rows_lock(wants=[BalanceWant(account, "JPY", ALL_SHARDS, creatable=False)])
        delay = merchant_settlement_delay_days(merchant=Merchant.objects.get(pk=merchant.pk))
        return payouts._available(locked=locked, account=account, asset_code="JPY", delay_days=delay, now=now)


def _jpy(merchant: Merchant, now: datetime) -> MerchantFunds:
    """JPY funds by both paths, which must agree, and with what payout creation sees as available."""
    found = {}
    for path in PATHS:
        with _reading(path):
            found[path] = next(f for f in merchant_funds(merchant=merchant, now=now) if f.asset_code == "JPY")
            assert _payout_view(merchant, now) == found[path].available, (path, found[path])
    assert found["ledger"] == found["summary"], found
    return found["ledger"]


@pytest.fixture
def dual_writes(tenant: Tenant) -> Iterator[None]:
    with _reading("summary"):
        yield


_OPS = st.lists(
    st.tuples(st.sampled_from(["credit", "back", "debit", "hold"]), st.integers(0, 6), st.integers(0, 86_399), st.integers(1, 900)),
    min_size=1, max_size=10,
)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(ops=_OPS, delay=st.integers(0, 4))
def test_available_and_pending_split_the_balance_and_debits_drain_available_first(dual_writes: None, ops: Any, delay: int) -> None:
    """Credits, payout money coming back, debits and held amounts on days around the delay:
    at every step available + pending = balance - held, neither is negative, pending is the
    window's credits (not the money back) as far as the balance holds them, and a debit
    takes from available before pending."""
    merchant = MerchantFactory()
    merchant_settlement_delay_set(merchant=merchant, days=delay)
    account = Account.objects.get(merchant_id=merchant.pk)
    now = timezone.now()
    first_pending_day = now.date() - timedelta(days=delay)
    balance = held = recent = 0
    before = _jpy(merchant, now)
    for kind, days_ago, seconds, amount in ops:
        created = min(now, datetime.combine(now.date() - timedelta(days=days_ago), datetime.min.time(), tzinfo=UTC) + timedelta(seconds=seconds))
        if kind == "credit":
            _post(account, amount, created)
            balance += amount
            recent += amount if delay and created.date() >= first_pending_day else 0
        elif kind == "back":  # available when it left: available again at once, whatever its day
            _payout_back(account, amount, created)
            balance += amount
        elif kind == "debit" and amount > balance - held:
            with pytest.raises(InsufficientFunds):
                _post(account, -amount, created)
        elif kind == "debit":
            _post(account, -amount, created)
            balance -= amount
        else:  # held: merchants have no hold service; the row's `held`, as a payout's reservation would be
            row = Balance.objects.filter(account=account, asset_id="JPY", balance__gte=F("held") + amount).first()
            if row is None:
                continue
            Balance.objects.filter(pk=row.pk).update(held=F("held") + amount)
            held += amount
        funds = _jpy(merchant, now)
        assert (funds.balance, funds.held) == (balance, held)
        assert funds.available + funds.pending == balance - held and funds.available >= 0 and funds.pending >= 0
        assert funds.pending == min(recent, balance - held)
        if kind in ("debit", "hold") and (funds.balance, funds.held) != (before.balance, before.held):
            taken = (before.balance - funds.balance) + (funds.held - before.held)
            assert funds.available == max(0, before.available - taken)
            assert funds.pending == before.pending - max(0, taken - before.available)
        before = funds


@pytest.mark.parametrize("path", PATHS)
def test_a_credit_is_available_from_midnight_utc_of_its_day_plus_the_delay_plus_one(tenant: Tenant, path: str) -> None:
    merchant = MerchantFactory()
    merchant_settlement_delay_set(merchant=merchant, days=2)
    account = Account.objects.get(merchant_id=merchant.pk)
    day = timezone.now().date() - timedelta(days=10)
    midnight = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    with _reading("summary"):  # dual writes on while posting
        _post(account, 100, midnight)  # day D, first instant
        _post(account, 20, midnight + timedelta(days=1) - timedelta(microseconds=1))  # day D, last instant
        _post(account, 3, midnight + timedelta(days=1))  # day D + 1
    d_plus_3 = midnight + timedelta(days=3)
    with _reading(path):
        assert merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=2, now=d_plus_3 - timedelta(microseconds=1)) == 123
        assert merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=2, now=d_plus_3) == 3
        assert merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=2, now=d_plus_3 + timedelta(days=1)) == 0
        assert merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=0, now=midnight) == 0  # no delay: at once
        assert merchant_recent_credits(account_id=account.pk, asset_code="POINT", delay_days=2, now=d_plus_3) == 0
        funds = next(f for f in merchant_funds(merchant=merchant, now=d_plus_3) if f.asset_code == "JPY")
    assert funds == MerchantFunds(asset_code="JPY", balance=123, held=0, pending=3, available=120)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("delay", [1, 2])
def test_a_credit_just_before_midnight_waits_at_least_the_delay(tenant: Tenant, path: str, delay: int) -> None:
    """A credit of 23:59:50 UTC is still pending a second before `delay` full days have passed
    (counting only `delay` days back from today would free it 10 s later with a delay of 1)."""
    merchant = MerchantFactory()
    account = Account.objects.get(merchant_id=merchant.pk)
    day = timezone.now().date() - timedelta(days=10)
    taken = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=23, minutes=59, seconds=50)
    with _reading("summary"):
        _post(account, 50, taken)
    with _reading(path):
        for now in (taken + timedelta(seconds=10), taken + timedelta(days=delay) - timedelta(seconds=1), taken + timedelta(days=delay)):
            assert merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=delay, now=now) == 50, now
        assert merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=delay, now=taken + timedelta(days=delay, seconds=10)) == 0


@pytest.mark.parametrize("path", PATHS)
def test_each_path_reads_the_window_not_the_history(tenant: Tenant, path: str) -> None:
    merchant = MerchantFactory()
    account = Account.objects.get(merchant_id=merchant.pk)
    now = timezone.now()
    with _reading(path), CaptureQueriesContext(connection) as queries:
        merchant_recent_credits(account_id=account.pk, asset_code="JPY", delay_days=3, now=now)
    [sql] = [q["sql"] for q in queries.captured_queries if "SUM(" in q["sql"]]
    window = (now - timedelta(days=3)).date()
    if path == "summary":
        assert "wallets_merchantdailytotal" in sql and '"day" >=' in sql and window.isoformat() in sql
    else:
        assert "wallets_ledgerentry" in sql and '"created" >=' in sql and window.isoformat() in sql
        # The payout money back, by the window's PAYOUT_BACK transactions (a partial index), not a
        # lookup of each credit's transaction for its kind (which tripled the read at a million entries).
        assert " JOIN " not in sql and "'payout_back'" in sql, sql


def test_the_merchant_s_delay_overrides_the_tenant_s(tenant: Tenant, dual_writes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenant, "settlement_delay_days", 5)  # the request's tenant row (connection.tenant)
    merchant = MerchantFactory()
    account = Account.objects.get(merchant_id=merchant.pk)
    now = timezone.now()
    _post(account, 700, now - timedelta(days=3))
    assert merchant_settlement_delay_days(merchant=merchant) == 5
    assert _jpy(merchant, now).pending == 700
    merchant_settlement_delay_set(merchant=merchant, days=1)
    assert merchant_settlement_delay_days(merchant=Merchant.objects.get(pk=merchant.pk)) == 1
    assert (_jpy(merchant, now).pending, _jpy(merchant, now).available) == (0, 700)
    merchant_settlement_delay_set(merchant=merchant, days=0)  # zero is an override too, not "unset"
    assert merchant_settlement_delay_days(merchant=merchant) == 0
    merchant_settlement_delay_set(merchant=merchant, days=None)
    assert merchant_settlement_delay_days(merchant=Merchant.objects.get(pk=merchant.pk)) == 5
    assert _jpy(merchant, now).pending == 700


@pytest.mark.parametrize("bad", [-1, 61, 10**6])
def test_a_bad_settlement_delay_is_refused_and_changes_nothing(tenant: Tenant, bad: int) -> None:
    merchant = MerchantFactory()
    merchant_settlement_delay_set(merchant=merchant, days=4)
    with pytest.raises(InvalidRequest) as refused:
        merchant_settlement_delay_set(merchant=Merchant.objects.get(pk=merchant.pk), days=bad)
    assert refused.value.param == "settlement_delay_days"
    assert Merchant.objects.get(pk=merchant.pk).settlement_delay_days == 4
    # The back office's form and the platform admin's tenant form refuse it before any service runs.
    assert "settlement_delay_days" in SettlementDelayForm({"idempotency_key": "k", "settlement_delay_days": bad}).errors
    # A copy: a ModelForm writes the field onto its instance, and `tenant` is the connection's.
    tenant_form = forms.modelform_factory(Tenant, fields=["settlement_delay_days"])(
        {"settlement_delay_days": bad}, instance=Tenant.objects.get(pk=tenant.pk))
    assert "settlement_delay_days" in tenant_form.errors
    # The database refuses what slips past both (a queryset update).
    for rows in (Merchant.objects.filter(pk=merchant.pk), Tenant.objects.filter(pk=tenant.pk)):
        with pytest.raises(DatabaseError), transaction.atomic():
            rows.update(settlement_delay_days=bad)
    assert Tenant.objects.get(pk=tenant.pk).settlement_delay_days == 2  # the default


def test_a_settlement_delay_form_of_no_days_means_the_tenant_s(tenant: Tenant) -> None:
    form = SettlementDelayForm({"idempotency_key": "k", "settlement_delay_days": ""})
    assert form.is_valid() and form.cleaned_data["settlement_delay_days"] is None
    assert "settlement_delay_days" in SettlementDelayForm({"idempotency_key": "k", "settlement_delay_days": "two"}).errors
