"""Balances at an instant (wallets/books.py): the daily totals of every account that make
them fast (wallets/daily_totals.py, staged migration `account_daily_totals`), the answer
equal on both read paths (the ledger alone; the summary plus the partial day), the trial
balance summing to zero per asset under concurrent payments, and reconciliation of every
account's daily totals."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payments.services.charges import payment_create
from tenants.models import Tenant
from tests.conftest import run_in_thread_tenant
from tests.factories import CustomerFactory, TerminalFactory, fund
from tests.staged_support import scratch_tenants, staged
from wallets.books import account_balance_before, account_balances_at, trial_balance_at
from wallets.daily_totals import ACCOUNTS_MIGRATION, MIGRATION, AccountDailyTotalsMigration
from wallets.models import Account, AccountDailyTotal, AccountKind, LedgerEntry, StagedMigrationState, StagedPhase, SystemRole
from wallets.services.ledger import Leg, ledger_post
from wallets.staged.phases import staged_phase_forget

BOTH = (MIGRATION, ACCOUNTS_MIGRATION)
BASE = datetime(2026, 11, 20, tzinfo=UTC)  # a UTC midnight; the instants below fall around later ones
DAY = 86_400


@pytest.fixture(autouse=True)
def _phases_forgotten() -> Iterator[None]:
    """Phases set in a rolled-back transaction must not outlive it in the process's cache."""
    staged_phase_forget()
    yield
    staged_phase_forget()


def _phases(phase: StagedPhase) -> None:
    """Both daily-totals migrations at `phase`, in this (rolled-back) transaction."""
    for name in BOTH:
        StagedMigrationState.objects.update_or_create(name=name, defaults={"phase": phase})
    staged_phase_forget()


def _at(offset: int) -> datetime:
    """An instant `offset` microseconds after BASE."""
    return BASE + timedelta(microseconds=offset)


# Offsets (µs) within four days, with the edges drawn often: midnights and a microsecond around them.
_EDGES = [d * DAY * 10**6 + e for d in range(5) for e in (-1, 0, 1)]
offsets = st.one_of(st.sampled_from([e for e in _EDGES if e >= 0]), st.integers(min_value=0, max_value=4 * DAY * 10**6))


def _naive(account_id: str, asset: str, *, upto: datetime, inclusive: bool) -> int:
    entries = LedgerEntry.objects.filter(account_id=account_id, asset_id=asset)
    entries = entries.filter(created__lte=upto) if inclusive else entries.filter(created__lt=upto)
    return sum(entries.values_list("amount", flat=True))


@pytest.mark.parametrize("phase", [StagedPhase.ABSENT, StagedPhase.READS_SWITCHED])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    postings=st.lists(st.tuples(offsets, st.integers(min_value=-500, max_value=1_000).filter(bool)), min_size=1, max_size=12),
    t1=offsets, t2=offsets,
)
def test_balance_at_t2_is_balance_at_t1_plus_the_lines_between(
    tenant: Tenant, phase: StagedPhase, postings: list[tuple[int, int]], t1: int, t2: int
) -> None:
    """For any account and t1 < t2: balance(t2) = balance(t1) + the entries in (t1, t2], on
    the ledger path and on the summary path (every posting made after the phase, so the
    summary is complete), each equal to the entries summed by hand; a customer, a merchant
    (credits only) and the amounts of both sides posted across UTC midnights."""
    t1, t2 = sorted((t1, t2))
    _phases(phase)
    with transaction.atomic():
        customer, merchant_id = CustomerFactory(), TerminalFactory().store.merchant_id
        wallet, shop = Account.objects.get(customer=customer), Account.objects.get(merchant_id=merchant_id)
        source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
        ledger_post(kind="adjustment", reference="adj_seed", legs=[Leg(wallet, "JPY", 10_000), Leg(source, "JPY", -10_000)], created=_at(0))
        for n, (offset, amount) in enumerate(postings):
            legs = [Leg(wallet, "JPY", amount), Leg(shop, "JPY", abs(amount) + 1), Leg(source, "JPY", -amount - abs(amount) - 1)]
            ledger_post(kind="adjustment", reference=f"adj_{n}", legs=legs, created=_at(offset))
    for account in (wallet, shop):
        with CaptureQueriesContext(connection) as queries:
            before, after = (account_balances_at(account_id=account.pk, at=_at(t)).get("JPY", 0) for t in (t1, t2))
        summary_read = any("wallets_merchantdailytotal" in q["sql"] for q in queries.captured_queries)
        assert summary_read == (phase == StagedPhase.READS_SWITCHED)
        between = sum(LedgerEntry.objects.filter(account=account, asset_id="JPY", created__gt=_at(t1), created__lte=_at(t2))
                      .values_list("amount", flat=True))
        assert after == before + between
        assert after == _naive(account.pk, "JPY", upto=_at(t2), inclusive=True)
        assert account_balance_before(account_id=account.pk, asset_code="JPY", instant=_at(t1)) == _naive(
            account.pk, "JPY", upto=_at(t1), inclusive=False
        )


def test_the_summary_holds_customer_and_system_legs_only_once_their_migration_writes(tenant: Tenant) -> None:
    _phases(StagedPhase.ABSENT)  # as a tenant from before the summary (a new one starts contracted)
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 5_000)
    wallet = Account.objects.get(customer=customer)
    assert not AccountDailyTotal.objects.filter(account=wallet).exists()
    StagedMigrationState.objects.update_or_create(name=ACCOUNTS_MIGRATION, defaults={"phase": StagedPhase.EXPANDED})
    staged_phase_forget()
    payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=700)
    rows = list(AccountDailyTotal.objects.filter(account=wallet, asset_id="JPY"))
    assert [(row.credited, row.debited, row.entries, row.returned) for row in rows] == [(0, 700, 1, 0)], rows
    assert not AccountDailyTotal.objects.filter(account__merchant_id=terminal.store.merchant_id).exists()  # its own migration is absent


def test_an_instant_before_the_account_existed_answers_zero_and_no_asset(tenant: Tenant) -> None:
    customer = CustomerFactory()
    fund(customer, 300)
    wallet = Account.objects.get(customer=customer)
    for phase in (StagedPhase.ABSENT, StagedPhase.READS_SWITCHED):
        _phases(phase)
        assert account_balances_at(account_id=wallet.pk, at=datetime(2001, 1, 1, tzinfo=UTC)) == {}
        assert account_balances_at(account_id=wallet.pk, at=datetime.now(UTC)) == {"JPY": 300}


@pytest.fixture
def scratch(django_db_setup: None, django_db_blocker: Any) -> Iterator[Tenant]:
    with django_db_blocker.unblock(), scratch_tenants(1, prefix="test_at") as (tenant,):
        connection.set_tenant(tenant)
        yield tenant


def _history(days_ago: tuple[int, ...]) -> tuple[Account, Account]:
    """A customer and a merchant with postings on each of `days_ago`, committed, made before
    any daily-totals phase (only a backfill brings them to the summary)."""
    customer, merchant_id = CustomerFactory(), TerminalFactory().store.merchant_id
    wallet, shop = Account.objects.get(customer=customer), Account.objects.get(merchant_id=merchant_id)
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    fees = Account.objects.get(system_role=SystemRole.FEES)
    now = datetime.now(UTC)
    with transaction.atomic():
        for ago in days_ago:
            created = now - timedelta(days=ago, minutes=1)
            legs = [Leg(wallet, "JPY", 100 + ago), Leg(shop, "JPY", 50), Leg(fees, "JPY", 7), Leg(source, "JPY", -157 - ago)]
            ledger_post(kind="adjustment", reference=f"adj_{ago}", legs=legs, created=created)
    return wallet, shop


def _switch_both(tenant: Tenant) -> None:
    for name in BOTH:
        for phase in ("expand", "backfill", "verify", "switch-reads"):
            run = staged(name, phase, tenant=tenant)
            assert run.code == 0, (name, phase, run)
    staged_phase_forget()


def _sums_by_asset(at: datetime) -> dict[str, int]:
    sums: dict[str, int] = defaultdict(int)
    for line in trial_balance_at(at=at):
        sums[line.asset] += line.balance
    return dict(sums)


def test_the_staged_migration_backfills_every_other_account_and_reads_agree(scratch: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    """History posted before expand: the backfill (in two-day windows) brings customer and
    system accounts' days to the summary; after switch-reads, balances at instants and the
    trial balance read the same as from the ledger; a rollback discards only those rows."""
    monkeypatch.setattr(AccountDailyTotalsMigration, "window_days", 2)
    wallet, shop = _history((9, 6, 5, 1, 0))
    instants = [datetime.now(UTC) - timedelta(days=d, hours=h) for d in (10, 6, 5, 2, 0) for h in (0, 3)]
    ledger_answers = [(account_balances_at(account_id=a.pk, at=t), t) for a in (wallet, shop) for t in instants]
    ledger_trial = [trial_balance_at(at=t) for t in instants]
    _switch_both(scratch)
    system_rows = AccountDailyTotal.objects.filter(account__kind=AccountKind.SYSTEM)
    assert AccountDailyTotal.objects.filter(account=wallet).count() == 5 and system_rows.filter(account__system_role="fees").count() == 5
    assert [(account_balances_at(account_id=a.pk, at=t), t) for a in (wallet, shop) for t in instants] == ledger_answers
    assert [trial_balance_at(at=t) for t in instants] == ledger_trial
    roles = {line.system_role for line in ledger_trial[-1] if line.kind == AccountKind.SYSTEM}
    assert roles == {"fees", "adjustments"}
    assert all(total == 0 for total in _sums_by_asset(datetime.now(UTC)).values())
    merchant_rows = AccountDailyTotal.objects.filter(account__kind=AccountKind.MERCHANT).count()
    for _ in range(3):  # reads_switched -> verified -> backfilled -> expanded... until the new data is discarded
        if staged(ACCOUNTS_MIGRATION, "rollback", tenant=scratch).code != 0:
            break
    staged_phase_forget()
    if StagedMigrationState.objects.get(name=ACCOUNTS_MIGRATION).phase == StagedPhase.EXPANDED:
        assert staged(ACCOUNTS_MIGRATION, "rollback", tenant=scratch).code == 0
    assert not AccountDailyTotal.objects.exclude(account__kind=AccountKind.MERCHANT).exists()
    assert AccountDailyTotal.objects.filter(account__kind=AccountKind.MERCHANT).count() == merchant_rows
    staged_phase_forget()
    assert [(account_balances_at(account_id=a.pk, at=t), t) for a in (wallet, shop) for t in instants] == ledger_answers


def test_reconciliation_checks_every_accounts_window_and_latest_day(scratch: Tenant) -> None:
    """A customer's summary edited behind the posting's back, in the window (today) and on a
    day older than it that is the account's latest (a quiet system-like history): both found."""
    from reconciliation.models import RunTrigger
    from reconciliation.services import reconciliation_run_execute, reconciliation_run_request

    def findings() -> list[dict[str, Any]]:
        run = reconciliation_run_execute(run_id=reconciliation_run_request(trigger=RunTrigger.COMMAND).pk)
        return [finding.details for finding in run.findings.filter(kind="daily_total_mismatch")]

    wallet, _ = _history((0,))
    quiet, _ = _history((12,))
    _switch_both(scratch)
    assert findings() == []
    AccountDailyTotal.objects.filter(account=wallet).update(credited=F("credited") + 1)
    AccountDailyTotal.objects.filter(account=quiet).update(entries=F("entries") + 1)
    found = {(d["account"], d["day"]) for d in findings()}
    today, old = datetime.now(UTC) - timedelta(minutes=1), datetime.now(UTC) - timedelta(days=12, minutes=1)
    assert found == {(wallet.pk, today.date().isoformat()), (quiet.pk, old.date().isoformat())}


@pytest.mark.parametrize("switched", [False, True])
def test_the_trial_balance_sums_to_zero_per_asset_mid_load(scratch: Tenant, switched: bool) -> None:
    """Real threads pay (each on its own connection) while the trial balance is taken again
    and again at the present instant: every one sums to zero per asset, on both read paths."""
    terminal = TerminalFactory()
    payers = [CustomerFactory() for _ in range(4)]
    for payer in payers:
        fund(payer, 100_000)
    if switched:
        _switch_both(scratch)
    stop = threading.Event()
    errors: list[BaseException] = []

    def pay(payer: Any) -> None:
        def body() -> None:
            while not stop.is_set():
                payment_create(terminal=terminal, customer=payer, asset_code="JPY", amount=3)

        try:
            run_in_thread_tenant(scratch, body)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pay, args=(payer,)) for payer in payers]
    for thread in threads:
        thread.start()
    try:
        taken = 0
        started = LedgerEntry.objects.count()
        while taken < 15 or LedgerEntry.objects.count() - started < 40:
            sums = _sums_by_asset(datetime.now(UTC))
            assert sums and all(total == 0 for total in sums.values()), sums
            taken += 1
            assert taken < 500
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors, errors
    assert set(_sums_by_asset(datetime.now(UTC)).values()) == {0}


def test_a_new_tenant_starts_with_both_summaries_complete(django_db_setup: None, django_db_blocker: Any) -> None:
    """Nothing to backfill in a tenant just made: both migrations start contracted, so its
    first postings are summarized and its reads use the summary at once."""
    with django_db_blocker.unblock(), scratch_tenants(1, prefix="test_new", legacy=()) as (tenant,):
        connection.set_tenant(tenant)
        phases = dict(StagedMigrationState.objects.filter(name__in=BOTH).values_list("name", "phase"))
        assert phases == dict.fromkeys(BOTH, StagedPhase.CONTRACTED)
        customer = CustomerFactory()
        fund(customer, 400)
        assert AccountDailyTotal.objects.filter(account__customer=customer).exists()
