"""Maker-checker by amount over time: the approval threshold holds for the sum of one
staff member's adjustments to one party and asset within the tenant's window, and for
each one; splits, concurrent splits from two threads, and the admin and the API
together all stop at it."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

from django.contrib.admin.utils import quote
from django.db.models import Sum
from django.utils import timezone

from payments.models import Adjustment, PendingAdjustment
from payments.services.approvals import adjustment_request
from tenants.models import Tenant
from tests.api.conftest import Api, World
from tests.api.test_backoffice import PASSWORD, _confirm_key, _login
from tests.conftest import run_in_thread_tenant
from wallets.models import Balance, Customer, StaffMember
from wallets.services.principals import api_key_create, customer_create
from wallets.services.roles import staff_login_ensure

CREDIT = {"asset": "JPY", "direction": "credit", "reason": "goodwill"}


def _finance(username: str | None = None) -> tuple[StaffMember, str]:
    staff = staff_login_ensure(username=username or f"fin-{uuid.uuid4().hex[:8]}", password=PASSWORD, role="finance")
    return staff, api_key_create(principal=staff)[1]


def _posted(customer_id: str) -> int:
    total = Balance.objects.filter(account__customer_id=customer_id, asset_id="JPY").aggregate(total=Sum("balance"))["total"]
    return int(total or 0)


def test_two_credits_that_cross_the_threshold_together_wait_for_a_checker(api: Api, world: World) -> None:
    """The report: two credits of 60,000 from one finance key both passed 100,000."""
    _, key = _finance()
    body = {"customer": world.customer.id, "amount": 60_000, **CREDIT}
    assert api.post("/v1/admin/adjustments", key, body).status_code == 201
    second = api.post("/v1/admin/adjustments", key, body)
    assert second.status_code == 202 and second.json()["object"] == "pending_adjustment", second.content
    assert _posted(world.customer.id) == 60_000


def test_ten_credits_at_the_threshold_post_one(api: Api, world: World) -> None:
    _, key = _finance()
    codes = [api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 100_000, **CREDIT}).status_code for _ in range(10)]
    assert codes == [201] + [202] * 9
    assert _posted(world.customer.id) == 100_000
    assert PendingAdjustment.objects.filter(customer_id=world.customer.id, status="pending").count() == 9


def test_debits_count_too_and_one_large_adjustment_alone_waits(api: Api, world: World) -> None:
    _, key = _finance()
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 100_001, **CREDIT}).status_code == 202
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 70_000, **CREDIT}).status_code == 201
    debit = {"customer": world.customer.id, "amount": 40_000, **CREDIT, "direction": "debit"}
    assert api.post("/v1/admin/adjustments", key, debit).status_code == 202


def test_the_sum_is_per_staff_member_party_and_asset(api: Api, world: World) -> None:
    _, key = _finance()
    _, other_key = _finance()
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 90_000, **CREDIT}).status_code == 201
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer2.id, "amount": 90_000, **CREDIT}).status_code == 201
    points = {"customer": world.customer.id, "amount": 90_000, **CREDIT, "asset": "POINT"}
    assert api.post("/v1/admin/adjustments", key, points).status_code == 201
    assert api.post("/v1/admin/adjustments", other_key, {"customer": world.customer.id, "amount": 90_000, **CREDIT}).status_code == 201


def test_the_window_rolls_and_is_a_tenant_setting(api: Api, world: World, tenant: Tenant) -> None:
    _staff, key = _finance()
    body = {"customer": world.customer.id, "amount": 80_000, **CREDIT}
    first = api.post("/v1/admin/adjustments", key, body).json()
    Adjustment.objects.filter(pk=first["id"]).update(created=timezone.now() - timedelta(hours=25))
    assert api.post("/v1/admin/adjustments", key, body).status_code == 201  # the first is out of the 24 h window
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings={"adjustment_approval_window_hours": 48})
    assert api.post("/v1/admin/adjustments", key, {**body, "amount": 1}).status_code == 202  # both count in 48 h


def test_approved_adjustments_do_not_count_against_the_maker(api: Api, world: World) -> None:
    _maker, key = _finance()
    _checker, checker_key = _finance()
    held = api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 150_000, **CREDIT}).json()
    r = api.post(f"/v1/admin/pending_adjustments/{held['id']}/approve", checker_key, {})
    assert r.status_code == 200 and r.json()["status"] == "approved" and r.json()["adjustment"], r.content
    assert _posted(world.customer.id) == 150_000
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 100_000, **CREDIT}).status_code == 201


def test_the_maker_cannot_approve_their_own_split(api: Api, world: World) -> None:
    _, key = _finance()
    body = {"customer": world.customer.id, "amount": 60_000, **CREDIT}
    api.post("/v1/admin/adjustments", key, body)
    held = api.post("/v1/admin/adjustments", key, body).json()
    r = api.post(f"/v1/admin/pending_adjustments/{held['id']}/approve", key, {})
    assert r.status_code == 403 and r.json()["error"]["code"] == "approver_is_maker", r.content
    assert _posted(world.customer.id) == 60_000


def test_the_admin_and_the_api_share_one_sum(api: Api, world: World) -> None:
    staff, key = _finance(f"fin-both-{uuid.uuid4().hex[:6]}")
    client = _login(staff.user.username, role="finance")
    url = f"/admin/wallets/customer/{quote(world.customer.id)}/act/adjust/"
    page = client.get(url)
    r = client.post(url, {"idempotency_key": _confirm_key(page), "amount": 60_000, **CREDIT}, follow=True)
    assert b"posted" in r.content
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 60_000, **CREDIT}).status_code == 202
    page = client.get(url)
    r = client.post(url, {"idempotency_key": _confirm_key(page), "amount": 40_001, **CREDIT}, follow=True)
    assert b"waiting for a second staff member" in r.content
    assert _posted(world.customer.id) == 60_000


def test_concurrent_splits_from_two_threads_post_at_most_the_threshold(live_tenant: Tenant) -> None:
    """Two threads of one staff member each post 60,000 at once, ten rounds: in every round
    one posts and one waits (without the maker's lock both would see room)."""
    staff = staff_login_ensure(username=f"fin-race-{uuid.uuid4().hex[:8]}", password=PASSWORD, role="finance")
    for _ in range(10):
        customer = customer_create(name=f"race {uuid.uuid4().hex[:6]}")
        barrier = threading.Barrier(2)
        results: list[Any] = []

        def split(customer: Customer = customer, barrier: threading.Barrier = barrier, results: list[Any] = results) -> None:
            barrier.wait()
            results.append(adjustment_request(maker=staff, customer=customer, amount=60_000, asset_code="JPY", direction="credit", reason="race"))

        threads = [threading.Thread(target=run_in_thread_tenant, args=(live_tenant, split)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(type(r).__name__ for r in results) == ["Adjustment", "PendingAdjustment"]
        assert _posted(customer.pk) == 60_000

