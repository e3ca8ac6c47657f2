"""Maker-checker by amount over time: the approval threshold holds for the sum of what one
staff member posts alone in one asset within the tenant's window, across every party (and
so for each party, and for each adjustment); splits, splits over many parties, concurrent
splits from two threads, and the admin and the API together all stop at it. The window is
a positive number of hours, fractions kept, refused otherwise where the tenant is set."""

from __future__ import annotations

import functools
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Sum
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apikit import fields
from devtools.demo_seed import staff_login_ensure
from payments.models import Adjustment, PendingAdjustment
from payments.selectors import staff_solo_postings_total
from payments.services.approvals import adjustment_request
from tenants.approvals import ASSET_CODE_RE, ApprovalLimits, approval_limits
from tenants.models import Tenant
from tests.api.conftest import Api, World
from tests.api.test_backoffice import PASSWORD, _confirm_key, _login
from tests.conftest import run_in_thread_tenant
from wallets.models import Balance, Customer, StaffMember
from wallets.services.principals import api_key_create, customer_create

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


def test_the_sum_is_per_staff_member_and_asset_across_parties(api: Api, world: World) -> None:
    _, key = _finance()
    _, other_key = _finance()
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 90_000, **CREDIT}).status_code == 201
    points = {"customer": world.customer.id, "amount": 90_000, **CREDIT, "asset": "POINT"}
    assert api.post("/v1/admin/adjustments", key, points).status_code == 201  # another asset
    assert api.post("/v1/admin/adjustments", other_key, {"customer": world.customer.id, "amount": 90_000, **CREDIT}).status_code == 201
    held = api.post("/v1/admin/adjustments", key, {"customer": world.customer2.id, "amount": 90_000, **CREDIT})
    assert held.status_code == 202, held.content  # another party, the same person and asset
    assert _posted(world.customer2.id) == 0


def test_one_login_cannot_spread_credits_over_many_parties(api: Api, world: World) -> None:
    """The report: one finance login credited customer 1, customer 2, ... merchant N, each
    up to the threshold, with no second approver."""
    _, key = _finance()
    parties = [{"customer": world.customer.id}, {"customer": world.customer2.id}, {"merchant": world.merchant.id},
               {"merchant": world.merchant2.id}]
    codes = [api.post("/v1/admin/adjustments", key, {**party, "amount": 40_000, **CREDIT}).status_code for party in parties]
    assert codes == [201, 201, 202, 202]
    assert _posted(world.customer.id) == _posted(world.customer2.id) == 40_000
    pending = PendingAdjustment.objects.filter(status="pending", asset_id="JPY", merchant_id__in=[world.merchant.id, world.merchant2.id])
    assert pending.count() == 2


def test_a_fractional_window_is_kept(api: Api, world: World, tenant: Tenant) -> None:
    """A window of 0.5 hours is 30 minutes (it was cut to 0: nothing accumulated)."""
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings={"adjustment_approval_window_hours": 0.5})
    _, key = _finance()
    body = {"customer": world.customer.id, "amount": 60_000, **CREDIT}
    first = api.post("/v1/admin/adjustments", key, body).json()
    Adjustment.objects.filter(pk=first["id"]).update(created=timezone.now() - timedelta(minutes=20))
    assert api.post("/v1/admin/adjustments", key, {**body, "customer": world.customer2.id}).status_code == 202  # 20 min: in
    Adjustment.objects.filter(pk=first["id"]).update(created=timezone.now() - timedelta(minutes=40))
    assert api.post("/v1/admin/adjustments", key, {**body, "customer": world.customer2.id}).status_code == 201  # 40 min: out


@pytest.mark.parametrize("extra", [
    {"adjustment_approval_window_hours": 0}, {"adjustment_approval_window_hours": -1},
    {"adjustment_approval_window_hours": "24"}, {"adjustment_approval_window_hours": True},
    {"adjustment_approval_window_hours": 10**9}, {"adjustment_approval_threshold": 1.5},
    {"adjustment_approval_threshold": -1}, {"adjustment_approval_thresholds": {"EUR": "5"}},
    {"adjustment_approval_thresholds": []},
    {"adjustment_approval_thresholds": {"jpy": 5000}}, {"adjustment_approval_thresholds": {"Jpy": 5000}},
    {"adjustment_approval_thresholds": {" JPY": 5000}}, {"adjustment_approval_thresholds": {"": 5000}},
    {"adjustment_approval_window_hours": 1e-9}, {"adjustment_approval_window_hours": 0.016},
])
def test_a_bad_setting_is_refused_where_the_tenant_is_set_and_fails_closed_if_stored(
    api: Api, world: World, tenant: Tenant, extra: dict[str, Any]
) -> None:
    row = Tenant.objects.get(pk=tenant.pk)
    row.extra_settings = extra
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert set(refused.value.message_dict) == {"extra_settings"}
    # Written around the model's validation, it holds every solo posting for a checker.
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings=extra)
    _, key = _finance()
    assert api.post("/v1/admin/adjustments", key, {"customer": world.customer.id, "amount": 1, **CREDIT}).status_code == 202
    assert _posted(world.customer.id) == 0


def test_the_shortest_window_and_asset_code_keys_are_taken() -> None:
    limits = approval_limits(extra={"adjustment_approval_window_hours": 1 / 60, "adjustment_approval_thresholds": {"JPY": 5}}, asset_code="JPY")
    assert limits == ApprovalLimits(threshold=5, window=timedelta(minutes=1))
    assert ASSET_CODE_RE.pattern == fields.ASSET_CODE_RE.pattern  # the one asset code form, copied below the kit


def test_the_platform_admin_refuses_a_bad_window_with_the_reason(tenant: Tenant) -> None:
    connection.set_schema_to_public()
    get_user_model().objects.create_superuser(username="platform-mc", password="pw-123456")
    public = Client(HTTP_HOST="public.test.localhost")
    assert public.login(username="platform-mc", password="pw-123456")
    url = f"/admin/tenants/tenant/{tenant.pk}/change/"
    form = public.get(url).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None and not isinstance(value, list | dict | bool)}
    data.update({"name": tenant.name, "extra_settings": '{"adjustment_approval_window_hours": 0}', "domains-TOTAL_FORMS": 0,
                 "domains-INITIAL_FORMS": 0})
    r = public.post(url, data)
    assert r.status_code == 200 and b"adjustment_approval_window_hours must be a number of hours from 1 minute" in r.content
    assert Tenant.objects.get(pk=tenant.pk).extra_settings.get("adjustment_approval_window_hours") is None
    data["extra_settings"] = '{"adjustment_approval_window_hours": 0.25}'
    assert public.post(url, data).status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).extra_settings == {"adjustment_approval_window_hours": 0.25}
    connection.set_tenant(tenant)


def test_the_window_rolls_and_is_a_tenant_setting(api: Api, world: World, tenant: Tenant) -> None:
    _staff, key = _finance()
    body = {"customer": world.customer.id, "amount": 80_000, **CREDIT}
    first = api.post("/v1/admin/adjustments", key, body).json()
    Adjustment.objects.filter(pk=first["id"]).update(created=timezone.now() - timedelta(hours=25))
    assert api.post("/v1/admin/adjustments", key, body).status_code == 201  # the first is out of the 24 h window
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings={"adjustment_approval_window_hours": 48})
    assert api.post("/v1/admin/adjustments", key, {**body, "amount": 1}).status_code == 202  # both count in 48 h


def test_the_solo_sum_reads_the_staff_asset_created_index(api: Api, world: World) -> None:
    staff, _ = _finance()
    with CaptureQueriesContext(connection) as captured:
        staff_solo_postings_total(staff=StaffMember.objects.get(pk=staff.pk), asset_code="JPY", since=timezone.now() - timedelta(hours=24))
    (query,) = [q["sql"] for q in captured.captured_queries if "payments_adjustment" in q["sql"]]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + query)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "adjustment_staff_asset_created" in plan, plan


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


def test_the_admin_and_the_api_share_one_sum_across_parties(api: Api, world: World) -> None:
    staff, key = _finance(f"fin-both-{uuid.uuid4().hex[:6]}")
    client = _login(staff.user.username, role="finance")
    url = f"/admin/wallets/customer/{quote(world.customer.id)}/act/adjust/"
    page = client.get(url)
    assert b"posted" in client.post(url, {"idempotency_key": _confirm_key(page), "amount": 60_000, **CREDIT}, follow=True).content
    assert api.post("/v1/admin/adjustments", key, {"merchant": world.merchant.id, "amount": 40_001, **CREDIT}).status_code == 202
    assert api.post("/v1/admin/adjustments", key, {"merchant": world.merchant.id, "amount": 40_000, **CREDIT}).status_code == 201


def test_concurrent_splits_over_two_parties_post_at_most_the_threshold(live_tenant: Tenant) -> None:
    """Two threads of one staff member each post 60,000 at once, to two different customers,
    ten rounds: in every round one posts and one waits (without the lock on the member's
    solo postings in the asset, both would see room)."""
    staff = staff_login_ensure(username=f"fin-race2-{uuid.uuid4().hex[:8]}", password=PASSWORD, role="finance")
    for _ in range(10):
        customers = [customer_create(name=f"race {uuid.uuid4().hex[:6]}") for _ in range(2)]
        barrier = threading.Barrier(2)
        results: list[Any] = []

        def split(customer: Customer, barrier: threading.Barrier = barrier, results: list[Any] = results) -> None:
            barrier.wait()
            results.append(adjustment_request(maker=staff, customer=customer, amount=60_000, asset_code="JPY", direction="credit", reason="race"))

        threads = [threading.Thread(target=run_in_thread_tenant, args=(live_tenant, functools.partial(split, c))) for c in customers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(type(r).__name__ for r in results) == ["Adjustment", "PendingAdjustment"]
        assert _posted(customers[0].pk) + _posted(customers[1].pk) == 60_000
        Adjustment.objects.filter(staff=staff).update(created=timezone.now() - timedelta(days=2))  # a fresh window per round


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
        Adjustment.objects.filter(staff=staff).update(created=timezone.now() - timedelta(days=2))  # a fresh window per round



def test_a_session_lock_with_the_same_hash_does_not_hold_up_a_staff_posting(live_tenant: Tenant) -> None:
    """The solo-postings lock lives in its own key space: a session advisory lock in the
    one-key space (a top-up recovery pass holds one for its whole run, PSP calls included)
    on the same 32-bit hash never makes a staff posting wait."""
    import psycopg
    from django.db import transaction

    from wallets.locks import staff_solo_postings_lock

    staff = staff_login_ensure(username=f"fin-space-{uuid.uuid4().hex[:8]}", password=PASSWORD, role="finance")
    key = f"{live_tenant.schema_name}:{staff.pk}:JPY"
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", [key])
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '500ms'")
            staff_solo_postings_lock(staff_id=staff.pk, asset_code="JPY")  # waited, it would fail here
