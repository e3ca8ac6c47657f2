"""Payout controls and scheduled payouts, committed against the real PSP simulator: the
schedule pays the whole available balance once per merchant, payable asset and day
(daily, or weekly on its weekday; none to a held, frozen or bank-less merchant); a payout
above the asset's threshold or to a bank account changed in the last 7 days waits for a
staff member, whose approval counts into the same solo sum as adjustments (over it, a
second one must approve); a failed payout is retried by staff under the same rule; staff
hold and release a merchant's payouts, audited. The back office: tests/api/test_payouts.py."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from payments.errors import ApproverIsMaker
from payments.models import MerchantBankAccount, Payout
from payments.selectors import staff_solo_postings_total
from payments.services.payouts import (
    bank_account_attach,
    merchant_payout_schedule_set,
    merchant_payouts_hold,
    payout_approve,
    payout_create,
    payout_retry,
    payouts_scheduled_run,
)
from tenants.models import Tenant
from tests.payouts_support import PAYOUTS_TENANT, balance, fund
from tests.payouts_support import World as PayoutsWorld
from wallets.models import Account, Asset, AuditEntry, Balance
from wallets.services.principals import staff_member_get_or_create


def _fresh(payout: Payout) -> Payout:
    connection.set_schema(PAYOUTS_TENANT["schema_name"])
    return Payout.objects.get(pk=payout.pk)


# --- Scheduled payouts ------------------------------------------------------------------------------


def test_the_schedule_pays_the_whole_available_balance_once_a_day_to_whom_it_is_due(payouts_world: PayoutsWorld) -> None:
    today = timezone.now().date()
    daily = payouts_world.merchant(funds=3_000, recent_funds=500)
    weekly_today = payouts_world.merchant(funds=2_000)
    weekly_other = payouts_world.merchant(funds=2_000)
    manual = payouts_world.merchant(funds=2_000)
    held = payouts_world.merchant(funds=2_000)
    frozen = payouts_world.merchant(funds=2_000)
    no_bank = payouts_world.merchant(funds=2_000, token="")
    merchant_payout_schedule_set(merchant=daily, schedule="daily")
    merchant_payout_schedule_set(merchant=weekly_today, schedule="weekly", weekday=today.weekday())
    merchant_payout_schedule_set(merchant=weekly_other, schedule="weekly", weekday=(today.weekday() + 1) % 7)
    for merchant in (held, frozen, no_bank):
        merchant_payout_schedule_set(merchant=merchant, schedule="daily")
    merchant_payouts_hold(merchant=held, held=True, reason="review")
    Account.objects.filter(merchant=frozen).update(frozen=True, frozen_reason="review")
    Balance.objects.filter(account__merchant=frozen).update(frozen=True)
    points = payouts_world.merchant(funds=0)
    merchant_payout_schedule_set(merchant=points, schedule="daily")
    from tests.payouts_support import fund as fund_jpy

    fund_jpy(points, 100, days_ago=3)

    counts = payouts_scheduled_run(concurrency=2)
    assert counts.get("error", 0) == 0, counts
    made = {p.merchant_id: p for p in Payout.objects.filter(schedule_day=today, merchant__in=[
        daily, weekly_today, weekly_other, manual, held, frozen, no_bank, points])}
    assert set(made) == {daily.pk, weekly_today.pk, points.pk}
    assert made[daily.pk].amount == 3_000 and made[daily.pk].origin == "scheduled"  # the pending 500 stays
    assert made[weekly_today.pk].amount == 2_000 and made[points.pk].asset_id == "JPY"  # only payable assets
    assert all(_fresh(p).status == "in_transit" for p in made.values())
    assert balance(daily) == 500 and balance(manual) == 2_000 and balance(held) == 2_000
    fund(daily, 1_000, days_ago=3)
    payouts_scheduled_run(concurrency=2)  # again the same day: nothing new
    assert Payout.objects.filter(merchant=daily, schedule_day=today).count() == 1 and balance(daily) == 1_500


# --- Approval (maker-checker) ------------------------------------------------------------------------


@pytest.fixture
def solo_limit(payouts_world: PayoutsWorld) -> Any:
    """Set what one staff member may post alone in the payouts tenant; restored after."""
    tenant = Tenant.objects.get(schema_name=PAYOUTS_TENANT["schema_name"])
    before = dict(tenant.extra_settings)

    def set_limit(threshold: int) -> None:
        Tenant.objects.filter(pk=tenant.pk).update(extra_settings={**before, "adjustment_approval_threshold": threshold})

    yield set_limit
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings=before)
    connection.set_schema(PAYOUTS_TENANT["schema_name"])


def test_a_payout_above_the_threshold_waits_and_its_approval_counts_into_the_staff_sum(
    payouts_world: PayoutsWorld, solo_limit: Any
) -> None:
    merchant = payouts_world.merchant(funds=20_000)
    Asset.objects.filter(code="JPY").update(payout_approval_threshold=5_000)
    try:
        small = payout_create(merchant=merchant, asset_code="JPY", amount=5_000)
        big = payout_create(merchant=merchant, asset_code="JPY", amount=6_000)
        bigger = payout_create(merchant=merchant, asset_code="JPY", amount=7_000)
    finally:
        Asset.objects.filter(code="JPY").update(payout_approval_threshold=None)
    assert _fresh(small).status == "in_transit"
    assert _fresh(big).awaiting_approval and "threshold" in _fresh(big).approval_reason and _fresh(big).attempts == 0
    alice, bob = payouts_world.staff, staff_member_get_or_create(username=f"bob-{uuid.uuid4().hex[:6]}")
    solo_limit(10_000)
    since = timezone.now() - timedelta(hours=1)
    approved = payout_approve(payout=big, staff=alice)  # within what Alice may post alone
    assert approved.approved_by_id == alice.pk and _fresh(big).status == "in_transit"
    assert staff_solo_postings_total(staff=alice, asset_code="JPY", since=since, merchant=merchant).total == 6_000
    first = payout_approve(payout=bigger, staff=alice)  # 6,000 + 7,000 is over her 10,000: a second staff member must approve
    assert first.approval_maker_id == alice.pk and _fresh(bigger).awaiting_approval
    with pytest.raises(ApproverIsMaker):
        payout_approve(payout=bigger, staff=alice)
    done = payout_approve(payout=bigger, staff=bob)
    assert done.approved_by_id == bob.pk and _fresh(bigger).status == "in_transit"
    assert staff_solo_postings_total(staff=alice, asset_code="JPY", since=since).total == 6_000  # a checked one is not solo
    assert staff_solo_postings_total(staff=bob, asset_code="JPY", since=since).total == 0
    assert list(AuditEntry.objects.filter(target_id=bigger.pk).order_by("id").values_list("action", flat=True)) == [
        "payout.approve_first", "payout.approve"]


def test_a_payout_to_a_bank_account_changed_this_week_waits(payouts_world: PayoutsWorld) -> None:
    merchant = payouts_world.merchant(funds=1_000)
    bank_account_attach(merchant=merchant, token="btok_bank", staff=payouts_world.staff)  # changed now
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=400)
    assert _fresh(payout).awaiting_approval and "7 days" in _fresh(payout).approval_reason
    assert _fresh(payout).approval_maker_id == payouts_world.staff.pk  # who changed the account proposes; never approves
    with pytest.raises(ApproverIsMaker):
        payout_approve(payout=payout, staff=payouts_world.staff)
    payout_approve(payout=payout, staff=staff_member_get_or_create(username=f"bob-{uuid.uuid4().hex[:6]}"))
    assert _fresh(payout).status == "in_transit"
    assert list(AuditEntry.objects.filter(target_id=merchant.pk, action__startswith="bank_account").order_by("id").values_list(
        "action", flat=True)) == [
        "bank_account.attach", "bank_account.change"]
    MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=8))
    assert _fresh(payout_create(merchant=merchant, asset_code="JPY", amount=400)).status == "in_transit"


def test_a_failed_payout_is_retried_by_staff_to_the_new_bank_account_with_a_second_approval(payouts_world: PayoutsWorld) -> None:
    merchant = payouts_world.merchant(funds=2_500, token="btok_bank_declined")
    failed = payout_create(merchant=merchant, asset_code="JPY", amount=2_500)
    assert _fresh(failed).status == "failed" and balance(merchant) == 2_500
    payouts_world.webhooks_relay()  # its payout.failed: nothing more moves
    bank_account_attach(merchant=merchant, token="btok_bank", staff=payouts_world.staff)  # the merchant's new account
    alice, bob = payouts_world.staff, staff_member_get_or_create(username=f"bob-{uuid.uuid4().hex[:6]}")
    retry = payout_retry(payout=failed, staff=alice)
    assert retry.retry_of_id == failed.pk and retry.origin == "retry" and retry.awaiting_approval and retry.approval_maker_id == alice.pk
    assert balance(merchant) == 0 and retry.destination_last4 == "6789"
    with pytest.raises(ApproverIsMaker):
        payout_approve(payout=retry, staff=alice)
    payout_approve(payout=retry, staff=bob)
    payouts_world.sim.settle_payouts()
    payouts_world.webhooks_relay()
    assert _fresh(retry).status == "paid" and _fresh(failed).status == "failed"


def test_held_payouts_wait_until_released_and_both_are_audited(payouts_world: PayoutsWorld) -> None:
    merchant = payouts_world.merchant(funds=1_000)
    bank_account_attach(merchant=merchant, token="btok_bank", staff=payouts_world.staff)  # approval needed: made, not sent
    waiting = payout_create(merchant=merchant, asset_code="JPY", amount=1_000)
    merchant_payouts_hold(merchant=merchant, held=True, reason="documents expired")
    payout_approve(payout=waiting, staff=staff_member_get_or_create(username=f"bob-{uuid.uuid4().hex[:6]}"))  # not who changed the account
    assert _fresh(waiting).status == "pending" and _fresh(waiting).attempts == 0  # approved, held: not sent
    merchant_payouts_hold(merchant=merchant, held=False, reason="documents received")
    from payments.services.payout_saga import payout_recovery_run

    Payout.objects.filter(pk=waiting.pk).update(created=timezone.now() - timedelta(seconds=5))
    payout_recovery_run()
    assert _fresh(waiting).status == "in_transit"
    assert list(AuditEntry.objects.filter(target_id=merchant.pk, action__startswith="payouts.").order_by("id").values_list(
        "action", "reason")) == [("payouts.hold", "documents expired"), ("payouts.release", "documents received")]


# --- A hold and a send at the same moment; an approval's lost send ------------------------------------


def test_a_hold_that_commits_first_stops_a_send_taking_its_lease_at_that_moment(payouts_world: PayoutsWorld, monkeypatch: Any) -> None:
    """Real threads on real PostgreSQL: the hold's transaction holds the merchant row while a
    send of the merchant's payout takes its lease; the lease waits for the hold (FOR SHARE)
    and, once the hold commits, finds the payouts held and sends nothing."""
    import threading
    import time as clock

    from django.db import transaction

    from payments.services import payouts as payouts_module
    from payments.services.payout_saga import payout_submit
    from tests.conftest import in_background

    merchant = payouts_world.merchant(funds=1_000)
    monkeypatch.setattr(payouts_module, "payout_submit_on_commit", lambda **kwargs: None)  # the send is the test's to make
    payout = payout_create(merchant=merchant, asset_code="JPY", amount=1_000)
    tenant = Tenant.objects.get(schema_name=PAYOUTS_TENANT["schema_name"])
    connection.set_tenant(tenant)
    holding, commit = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            merchant_payouts_hold(merchant=merchant, held=True, reason="fraud review")
            holding.set()
            assert commit.wait(30)

    held_thread, held_box = in_background(tenant, hold)
    assert holding.wait(20)
    sender_pid: list[int] = []

    def send() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            sender_pid.append(int(cursor.fetchone()[0]))
        return payout_submit(payout_id=payout.pk)

    send_thread, send_box = in_background(tenant, send)
    deadline = clock.monotonic() + 20
    while send_thread.is_alive():  # until the send waits on a lock (or, unfixed, is done)
        assert clock.monotonic() < deadline, "the send neither waited nor finished"
        if sender_pid:
            with connection.cursor() as cursor:
                cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [sender_pid[0]])
                row = cursor.fetchone()
            if row and row[0] == "Lock":
                break
        clock.sleep(0.02)
    commit.set()
    held_thread.join(30)
    send_thread.join(30)
    assert "error" not in held_box and "error" not in send_box, (held_box, send_box)
    assert send_box["result"] == "skipped"
    assert _fresh(payout).attempts == 0 and _fresh(payout).status == "pending"
    assert payouts_world.sim.payouts(payouts_world.psp_key, reference=payout.pk) == []


def test_an_approval_whose_send_is_lost_marks_the_recovery_due(payouts_world: PayoutsWorld, monkeypatch: Any) -> None:
    from payments.services import payouts as payouts_module
    from tenants.models import DueWork, DueWorkKind

    merchant = payouts_world.merchant(funds=900)
    bank_account_attach(merchant=merchant, token="btok_bank", staff=payouts_world.staff)  # changed now: the payout waits
    waiting = payout_create(merchant=merchant, asset_code="JPY", amount=900)
    assert _fresh(waiting).awaiting_approval
    DueWork.objects.filter(tenant_id=PAYOUTS_TENANT["schema_name"]).delete()
    monkeypatch.setattr(payouts_module, "payout_submit_on_commit", lambda **kwargs: None)  # the broker lost the send
    payout_approve(payout=waiting, staff=staff_member_get_or_create(username=f"bob-{uuid.uuid4().hex[:6]}"))
    due = DueWork.objects.get(tenant_id=PAYOUTS_TENANT["schema_name"], kind=DueWorkKind.TOPUPS)
    assert timezone.now() < due.due_at <= timezone.now() + timedelta(seconds=3)  # a lease from now: the send had its chance first
