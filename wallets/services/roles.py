"""Back-office roles (Django groups with permissions) and staff logins, per tenant schema.
Every role sees everything (the view permissions); ROLE_PERMISSIONS adds what each may
change. The admin API face asks for the same permissions, read at each request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from django_tenants.utils import get_public_schema_name

from wallets.keycache import api_key_cache_invalidate
from wallets.locks import staff_api_keys_live_lock
from wallets.models import ApiKey, StaffMember
from wallets.services.audit import audit_record

TENANT_APP_LABELS = ("wallets", "payments", "idempotency", "webhooks")

ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "viewer": (),
    "operator": (
        "wallets.add_customer", "wallets.change_customer", "wallets.add_merchant", "wallets.add_store", "wallets.add_terminal",
        "wallets.freeze_account", "wallets.manage_apikey", "wallets.issue_apikey", "payments.requeue_outboxevent",
        "webhooks.redeliver_webhookdelivery",
        "webhooks.manage_webhookendpoint", "payments.refund_payment", "idempotency.switch_idempotency_mode",
        "payments.attach_bank_account", "payments.manage_payouts",
    ),
    "finance": (
        "payments.refund_payment", "payments.add_pendingadjustment", "payments.approve_pendingadjustment", "payments.settle_topup",
        "payments.manage_payouts", "payments.approve_payout", "payments.resolve_payout", "wallets.set_settlement_delay",
        "payments.add_feeschedule", "reconciliation.view_books",
    ),
}
ROLES = tuple(ROLE_PERMISSIONS)


def _permissions(names: tuple[str, ...]) -> list[Permission]:
    wanted = Q(pk__in=[])
    for name in names:
        app_label, codename = name.split(".")
        wanted |= Q(content_type__app_label=app_label, codename=codename)
    found = list(Permission.objects.filter(wanted))
    if len(found) != len(names):
        missing = set(names) - {f"{p.content_type.app_label}.{p.codename}" for p in found}
        raise LookupError(f"permissions not migrated yet: {sorted(missing)}")
    return found


@transaction.atomic
def staff_roles_ensure() -> dict[str, Group]:
    """Create or repair the current tenant's role groups (idempotent). Locks: the rows it writes."""
    view_all = list(Permission.objects.filter(content_type__app_label__in=TENANT_APP_LABELS, codename__startswith="view_"))
    groups: dict[str, Group] = {}
    for role, extra in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(view_all + _permissions(extra))
        groups[role] = group
    return groups


@transaction.atomic
def staff_role_set(*, staff: StaffMember, role: str) -> None:
    """Put the staff member's login in `role`'s group alone (audited). Locks: the rows it writes."""
    before = sorted(staff.user.groups.values_list("name", flat=True))
    staff.user.groups.set([staff_roles_ensure()[role]])
    audit_record(action="staff.role_set", target_type="staff_member", target_id=staff.pk, before={"roles": before}, after={"roles": [role]})


def staff_login_deactivation_apply(*, user: Any, update_fields: Iterable[str] | None = None, raw: bool = False) -> list[str]:
    """Deactivating a staff login revokes its API keys for good (pre_save of any login save,
    wallets.apps): when the login is being deactivated, or was inactive, every live key of
    its staff member is revoked, audited, and the API key epoch bumped after commit, so a
    reactivated login comes back with no key. Returns the revoked keys' ids.

    It runs before the user's row is written, so a failed save in autocommit leaves fewer
    keys, never an inactive login with live ones. Writes that send no signal (update(), raw
    SQL) are caught by the database guard (wallets migration 0015), which bumps no epoch:
    staff keys are never cached, so that holds from the next request.

    Locks: the staff member's live key rows (`staff_api_keys_live_lock`)."""
    fields = None if update_fields is None else set(update_fields)
    if raw or user.pk is None or (fields is not None and "is_active" not in fields):
        return []
    if getattr(connection, "schema_name", None) == get_public_schema_name():
        return []  # platform logins: staff keys live in the tenant schemas
    stored = get_user_model().objects.filter(pk=user.pk).values_list("is_active", flat=True).first()
    if stored is None or (stored and user.is_active):
        return []
    staff = StaffMember.objects.filter(user_id=user.pk).first()
    if staff is None:
        return []
    with transaction.atomic():
        live = staff_api_keys_live_lock(staff_id=staff.pk)
        now = timezone.now()
        ApiKey.objects.filter(pk__in=[k.pk for k in live]).update(revoked_at=now)
        why = "staff login deactivated" if stored else "staff login was inactive"
        for key in live:
            audit_record(
                action="api_key.revoke", target_type="api_key", target_id=key.pk, reason=why,
                before={"prefix": key.prefix, "principal": staff.pk, "revoked_at": None}, after={"revoked_at": now},
            )
        if stored:
            audit_record(
                action="staff.deactivate", target_type="staff_member", target_id=staff.pk,
                before={"is_active": True}, after={"is_active": False, "api_keys_revoked": [k.pk for k in live]},
            )
        api_key_cache_invalidate()
    return [k.pk for k in live]
