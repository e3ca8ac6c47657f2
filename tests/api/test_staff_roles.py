"""Staff keys act with their login's roles on the admin face: every admin-face POST for
viewer, operator, finance and a deactivated login; roles and deactivation read at each
request (through the key cache too); minting keys as its own permission, never for a
principal with more power than the minter."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.forms import MultiWidget

from devtools.demo_seed import staff_login_ensure
from fastpath import epochs
from payments.models import PendingAdjustment
from payments.services.approvals import adjustment_request
from tenants.models import Tenant
from tests.api.conftest import Api, World, error_of
from tests.api.test_backoffice import _login
from tests.api.test_matrix import ENDPOINTS
from wallets.keycache import api_key_epoch_redis_key
from wallets.models import Account, ApiKey, AuditEntry, Customer, LedgerEntry, StaffMember
from wallets.services.principals import api_key_create

ROLES = ("viewer", "operator", "finance")

# Who may take each admin-face POST, written out by hand (not derived from the code's
# tables), so a permission that drifts fails here.
ALLOWED: dict[str, set[str]] = {
    "/v1/admin/adjustments": {"finance"},
    "/v1/admin/api_keys": {"operator"},
    "/v1/admin/api_keys/{api_key_id}/revoke": {"operator"},
    "/v1/admin/api_keys/{api_key_id}/rotate": {"operator"},
    "/v1/admin/customers": {"operator"},
    "/v1/admin/customers/{customer_id}/contact": {"operator"},
    "/v1/admin/customers/{customer_id}/freeze": {"operator"},
    "/v1/admin/customers/{customer_id}/unfreeze": {"operator"},
    "/v1/admin/merchants": {"operator"},
    "/v1/admin/stores": {"operator"},
    "/v1/admin/terminals": {"operator"},
    "/v1/admin/pending_adjustments/{pending_adjustment_id}/approve": {"finance"},
    "/v1/admin/pending_adjustments/{pending_adjustment_id}/reject": {"finance"},
    "/v1/admin/fee_schedules": {"finance"},
}


def _staff(role: str | None, *, active: bool = True) -> tuple[StaffMember, str]:
    staff = staff_login_ensure(username=f"{role or 'none'}-{uuid.uuid4().hex[:8]}", password="pw-roles-123", role=role)
    if not active:
        User.objects.filter(pk=staff.user_id).update(is_active=False)
    return staff, api_key_create(principal=staff)[1]


def _request_for(template: str, world: World) -> tuple[str, dict[str, Any], Callable[[], Any]]:
    """A fresh target (so each call can succeed on its own), the path, a valid body, and
    a snapshot of what the call would change."""
    customer = Customer.objects.get(pk=world.customer.id)
    if "{api_key_id}" in template:
        key = api_key_create(principal=world.terminal2.obj)[0]
        path = template.format(api_key_id=key.pk)
        body: dict[str, Any] = {"overlap_seconds": 0} if path.endswith("rotate") else {}
        return path, body, lambda: (ApiKey.objects.count(), ApiKey.objects.get(pk=key.pk).revoked_at, ApiKey.objects.get(pk=key.pk).expires_at)
    if "{pending_adjustment_id}" in template:
        maker, _ = _staff("finance")
        pending = adjustment_request(maker=maker, customer=customer, asset_code="JPY", amount=10**6, direction="credit", reason="held")
        assert isinstance(pending, PendingAdjustment)
        path = template.format(pending_adjustment_id=pending.pk)
        return path, {}, lambda: (PendingAdjustment.objects.get(pk=pending.pk).status, LedgerEntry.objects.count())
    if "{customer_id}" in template:
        path = template.format(customer_id=customer.pk)
        if path.endswith("unfreeze"):
            Account.objects.filter(customer=customer).update(frozen=True)
        body = {"email": f"{uuid.uuid4().hex[:6]}@example.com"} if path.endswith("contact") else {"reason": "roles test"}
        return path, body, lambda: (Account.objects.get(customer=customer).frozen, AuditEntry.objects.count())
    bodies = {
        "/v1/admin/adjustments": {"customer": customer.pk, "asset": "JPY", "amount": 100, "direction": "credit", "reason": "roles"},
        "/v1/admin/api_keys": {"principal_type": "terminal", "principal_id": world.terminal.id},
        "/v1/admin/customers": {"name": "New customer"},
        "/v1/admin/merchants": {"name": "New merchant"},
        "/v1/admin/stores": {"merchant": world.merchant.id, "name": "New store"},
        "/v1/admin/terminals": {"store": world.store.pk, "name": "New till"},
        "/v1/admin/fee_schedules": {"asset": "JPY", "rate": "0.01"},  # each from the earliest start: a start of its own
    }
    return template, bodies[template], lambda: (AuditEntry.objects.count(), LedgerEntry.objects.count(), ApiKey.objects.count())


def test_the_role_matrix_covers_every_admin_face_post() -> None:
    posts = {template for method, template, face in ENDPOINTS if method == "POST" and face == "admin"}
    assert posts == set(ALLOWED)


@pytest.mark.parametrize("role", [*ROLES, "deactivated"])
def test_every_admin_face_post_by_role(api: Api, world: World, role: str) -> None:
    _, key = _staff("operator" if role == "deactivated" else role, active=role != "deactivated")
    for template, allowed in sorted(ALLOWED.items()):
        path, body, state = _request_for(template, world)
        before = state()
        r = api.post(path, key, body)
        if role == "deactivated":
            assert r.status_code == 401, (path, r.status_code, r.content)
            assert state() == before, path
        elif role in allowed:
            assert 200 <= r.status_code < 300, (path, role, r.status_code, r.content)
        else:
            assert r.status_code == 403, (path, role, r.status_code, r.content)
            assert error_of(r)["code"] == "permission_denied"
            assert state() == before, path


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_the_admin_face(api: Api, world: World, role: str) -> None:
    _, key = _staff(role)
    for method, template, face in ENDPOINTS:
        if face == "admin" and method == "GET" and "{" not in template:
            assert api.get(template, key).status_code == 200, (template, role)


def test_a_login_with_no_role_is_refused_everything(api: Api, world: World) -> None:
    _, key = _staff(None)
    assert api.get("/v1/admin/customers", key).status_code == 403
    assert api.post("/v1/admin/customers", key, {"name": "x"}).status_code == 403


def test_the_viewer_and_operator_of_the_report_cannot_move_money(api: Api, world: World) -> None:
    """What was found on a fresh `make run`: a viewer's key posted an adjustment and minted
    a customer's key, an operator's key posted an adjustment."""
    adjustment = {"customer": world.customer.id, "asset": "JPY", "amount": 500, "direction": "credit", "reason": "x"}
    for role in ("viewer", "operator"):
        _, key = _staff(role)
        assert api.post("/v1/admin/adjustments", key, adjustment).status_code == 403, role
    _, viewer = _staff("viewer")
    assert api.post("/v1/admin/api_keys", viewer, {"principal_type": "customer", "principal_id": world.customer.id}).status_code == 403
    assert not LedgerEntry.objects.filter(account__customer_id=world.customer.id).exists()


def test_a_change_of_role_holds_at_the_next_request_even_from_the_key_cache(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    staff, key = _staff("operator")
    assert api.get("/v1/admin/customers", key).status_code == 200  # the key is cached now
    path = f"/v1/admin/customers/{world.customer.id}/freeze"
    assert api.post(path, key, {"reason": "first"}).status_code == 200
    staff_login_ensure(username=staff.user.username, password="pw-roles-123", role="viewer")
    assert api.post(f"/v1/admin/customers/{world.customer.id}/unfreeze", key, {"reason": ""}).status_code == 403
    assert Account.objects.get(customer_id=world.customer.id).frozen


def test_a_deactivated_login_stops_its_keys_at_once_even_from_the_key_cache(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    staff, key = _staff("operator")
    assert api.get("/v1/admin/customers", key).status_code == 200  # the key is cached now
    User.objects.filter(pk=staff.user_id).update(is_active=False)
    r = api.get("/v1/admin/customers", key)
    assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"
    settings.TALLY_API_KEY_CACHE_SECONDS = 0  # and read from PostgreSQL, the key is dead too
    assert api.get("/v1/admin/customers", key).status_code == 401


# --- minting keys ----------------------------------------------------------------------


def _mint(api: Api, key: str, principal_type: str, principal_id: str) -> Any:
    return api.post("/v1/admin/api_keys", key, {"principal_type": principal_type, "principal_id": principal_id})


def test_minting_a_terminals_key_is_audited_with_the_minter(api: Api, world: World) -> None:
    staff, key = _staff("operator")
    r = _mint(api, key, "terminal", world.terminal.id)
    assert r.status_code == 201, r.content
    entry = AuditEntry.objects.get(action="api_key.create", target_id=r.json()["id"])
    assert entry.actor.startswith(f"staff:{staff.pk} key ak_") and entry.after["principal"] == world.terminal.id
    assert r.json()["key"] not in str(entry.after)


def test_a_customers_key_is_minted_by_a_superuser_only(api: Api, world: World) -> None:
    """A customer's key spends their money, which no role moves alone: an operator who
    could mint one could unfreeze a wallet and transfer its balance away."""
    customer_keys = ApiKey.objects.filter(customer=world.customer.obj)
    before = customer_keys.count()
    for role in ROLES:
        _, key = _staff(role)
        assert _mint(api, key, "customer", world.customer.id).status_code == 403, role
        customer_key = api_key_create(principal=world.customer.obj)[0]
        assert api.post(f"/v1/admin/api_keys/{customer_key.pk}/rotate", key, {"overlap_seconds": 0}).status_code == 403, role
        assert ApiKey.objects.get(pk=customer_key.pk).expires_at is None
    assert customer_keys.count() == before + len(ROLES)  # the ones made here to rotate, no more
    assert _mint(api, world.staff.key, "customer", world.customer.id).status_code == 201  # the world's staff is a superuser


def test_a_staff_key_is_minted_by_its_own_login_only(api: Api, world: World) -> None:
    """A staff key stays with whoever minted it and acts with its member's roles as they
    will be: minted for a colleague (even one with less power today), it would let one
    person act as two (maker and checker) or inherit the colleague's next role."""
    operator, key = _staff("operator")
    viewer, _ = _staff("viewer")
    finance, finance_key = _staff("finance")
    superuser = staff_login_ensure(username=f"root-{uuid.uuid4().hex[:6]}", password="pw-roles-123", superuser=True)
    root_key = api_key_create(principal=superuser)[1]
    before = ApiKey.objects.count()
    for minter, target in ((key, viewer), (key, finance), (key, superuser), (root_key, finance), (root_key, viewer)):
        r = _mint(api, minter, "staff", target.pk)
        assert r.status_code == 403 and error_of(r)["code"] == "permission_denied", r.content
    assert ApiKey.objects.count() == before
    assert _mint(api, key, "staff", operator.pk).status_code == 201  # its own
    viewer_key = api_key_create(principal=viewer)[0]
    assert api.post(f"/v1/admin/api_keys/{viewer_key.pk}/rotate", key, {"overlap_seconds": 0}).status_code == 403
    assert ApiKey.objects.get(pk=viewer_key.pk).expires_at is None
    assert _mint(api, finance_key, "staff", finance.pk).status_code == 403  # finance holds no issue_apikey


def test_unticking_staff_status_stops_the_keys_too(api: Api, world: World) -> None:
    staff, key = _staff("operator")
    User.objects.filter(pk=staff.user_id).update(is_staff=False)  # locked out of the admin
    assert api.get("/v1/admin/customers", key).status_code == 401


# --- deactivation revokes ---------------------------------------------------------------


def _epoch(schema: str) -> bytes | None:
    return epochs.epoch_read(key=api_key_epoch_redis_key(schema=schema))


def test_deactivating_a_login_revokes_its_keys_for_good(
    api: Api, world: World, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The report: reactivating a login brought back every key it had. A save of the user
    (a shell, a script) revokes them, audited, and bumps the tenant's key epoch."""
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    staff, key = _staff("operator")
    other_key = api_key_create(principal=staff)[1]
    assert api.get("/v1/admin/customers", key).status_code == 200  # the key is cached now
    schema = connection.schema_name
    before = _epoch(schema)
    user = User.objects.get(pk=staff.user_id)
    user.is_active = False
    with django_capture_on_commit_callbacks(execute=True):
        user.save()
    assert _epoch(schema) != before
    assert api.get("/v1/admin/customers", key).status_code == 401
    revoked = ApiKey.objects.filter(staff=staff)
    assert revoked.count() == 2 and not revoked.filter(revoked_at__isnull=True).exists()
    entries = AuditEntry.objects.filter(action="api_key.revoke", target_id__in=[k.pk for k in revoked], reason="staff login deactivated")
    assert entries.count() == 2
    assert AuditEntry.objects.get(action="staff.deactivate", target_id=staff.pk).after["api_keys_revoked"] == sorted(k.pk for k in revoked)
    user.is_active = True
    user.save()
    for raw in (key, other_key):
        assert api.get("/v1/admin/customers", raw).status_code == 401  # reactivated, the old keys stay dead
    assert api.get("/v1/admin/customers", api_key_create(principal=staff)[1]).status_code == 200  # a new key works


def test_deactivating_a_login_in_the_back_office_revokes_its_keys(api: Api, world: World) -> None:
    staff, key = _staff("operator")
    admin = _login(f"root-{uuid.uuid4().hex[:6]}", superuser=True)
    url = f"/admin/auth/user/{staff.user_id}/change/"
    form = admin.get(url).context["adminform"].form
    data: dict[str, Any] = {}
    for name, bound in ((n, form[n]) for n in form.fields):
        value = bound.value()
        if bound.field.disabled or value in (None, False, [], ""):
            continue
        if isinstance(bound.field.widget, MultiWidget):  # the date-and-time fields
            data.update({f"{name}_{i}": str(part) for i, part in enumerate(bound.field.widget.decompress(value))})
        else:
            data[name] = "on" if value is True else value
    data.pop("is_active")  # unticked
    r = admin.post(url, data)
    assert r.status_code == 302, r.content[:3000]
    assert not User.objects.get(pk=staff.user_id).is_active
    assert ApiKey.objects.get(staff=staff).revoked_at is not None
    assert AuditEntry.objects.get(action="staff.deactivate", target_id=staff.pk).actor.startswith("user:root-")
    User.objects.filter(pk=staff.user_id).update(is_active=True)
    assert api.get("/v1/admin/customers", key).status_code == 401


def test_a_login_deactivated_without_a_save_loses_its_keys_for_good(api: Api, world: World, settings: Any) -> None:
    """A QuerySet.update() sends no signal: the database guard (wallets migration 0015)
    revokes the keys in the same statement, audited, so reactivating the same way brings
    none back, even to a process that had the key in its cache (staff keys are not cached)."""
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    staff, key = _staff("operator")
    assert api.get("/v1/admin/customers", key).status_code == 200  # would be cached, were staff keys cached
    User.objects.filter(pk=staff.user_id).update(is_active=False)
    assert api.get("/v1/admin/customers", key).status_code == 401
    assert ApiKey.objects.get(staff=staff).revoked_at is not None
    entry = AuditEntry.objects.get(action="api_key.revoke", target_id=ApiKey.objects.get(staff=staff).pk)
    assert (entry.actor, entry.via, entry.before["principal"]) == ("database", "system", staff.pk)
    User.objects.filter(pk=staff.user_id).update(is_active=True)
    assert api.get("/v1/admin/customers", key).status_code == 401
    user = User.objects.get(pk=staff.user_id)
    user.save()  # a later save finds nothing left to revoke
    assert AuditEntry.objects.filter(action="api_key.revoke", target_id=ApiKey.objects.get(staff=staff).pk).count() == 1


@pytest.mark.parametrize("how", ["bulk_update", "raw_sql", "is_staff"])
def test_every_other_way_of_deactivating_a_login_revokes_its_keys(api: Api, world: World, how: str) -> None:
    staff, key = _staff("operator")
    _, untouched_key = _staff("operator")
    user = User.objects.get(pk=staff.user_id)
    if how == "bulk_update":
        user.is_active = False
        User.objects.bulk_update([user], ["is_active"])
        user.is_active = True
        User.objects.bulk_update([user], ["is_active"])
    elif how == "raw_sql":
        with connection.cursor() as cursor:
            cursor.execute("UPDATE auth_user SET is_active = false WHERE id = %s", [user.pk])
            cursor.execute("UPDATE auth_user SET is_active = true WHERE id = %s", [user.pk])
    else:
        User.objects.filter(pk=user.pk).update(is_staff=False)
        User.objects.filter(pk=user.pk).update(is_staff=True)
    assert User.objects.filter(pk=user.pk, is_active=True, is_staff=True).exists()
    assert api.get("/v1/admin/customers", key).status_code == 401
    assert api.get("/v1/admin/customers", untouched_key).status_code == 200  # another login's keys live on
    assert api.get("/v1/admin/customers", api_key_create(principal=staff)[1]).status_code == 200  # a new key works


def test_other_saves_of_a_login_and_platform_logins_revoke_nothing(api: Api, world: World, tenant: Tenant) -> None:
    staff, key = _staff("operator")
    user = User.objects.get(pk=staff.user_id)
    user.first_name = "Renamed"
    user.save()
    user.save(update_fields=["last_login"])
    User.objects.filter(pk=user.pk).update(is_active=True, is_staff=True)  # no change: the guard does not fire
    assert api.get("/v1/admin/customers", key).status_code == 200
    assert ApiKey.objects.get(staff=staff).revoked_at is None


def test_deactivating_a_platform_login_touches_no_tenant_key(api: Api, world: World, tenant: Tenant) -> None:
    """A platform login (public schema) with the same id as a tenant's staff login:
    deactivating it, by a save or an update, neither fails nor revokes that tenant's keys
    (nor audits anything there)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT greatest((SELECT max(id) FROM auth_user), (SELECT max(id) FROM public.auth_user))")
        same_id = int(cursor.fetchone()[0] or 0) + 1000
    name = f"twin-{uuid.uuid4().hex[:6]}"
    User.objects.create(id=same_id, username=name)
    staff = staff_login_ensure(username=name, password="pw-roles-123", role="operator")
    key = api_key_create(principal=staff)[1]
    audit_before = AuditEntry.objects.count()
    connection.set_schema_to_public()
    try:
        platform = User.objects.create_superuser(id=same_id, username=f"platform-{uuid.uuid4().hex[:6]}", password="pw-123456")
        platform.is_active = False
        platform.save()
        User.objects.filter(pk=same_id).update(is_active=True)
        User.objects.filter(pk=same_id).update(is_active=False, is_staff=False)
        assert not User.objects.get(pk=same_id).is_active
    finally:
        connection.set_tenant(tenant)
    assert ApiKey.objects.get(staff=staff).revoked_at is None
    assert AuditEntry.objects.count() == audit_before
    assert api.get("/v1/admin/customers", key).status_code == 200
