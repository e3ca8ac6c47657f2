"""Write services for a tenant's parties and their API keys."""

from __future__ import annotations

import time
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenants.models import SETTLEMENT_DELAY_MAX_DAYS
from wallets import ids
from wallets.contacts import MIGRATION as CONTACTS_MIGRATION
from wallets.contacts import contact_new_fields
from wallets.errors import InvalidRequest, InvalidState, NotPermitted
from wallets.keycache import api_key_cache_invalidate
from wallets.models import (
    KEY_PREFIXES,
    Account,
    AccountKind,
    ApiKey,
    Customer,
    CustomerLegacyContact,
    Merchant,
    PrincipalType,
    StaffMember,
    Store,
    Terminal,
)
from wallets.selectors import api_key_hash
from wallets.services.audit import audit_record
from wallets.services.ledger import balance_rows_create
from wallets.staged.phases import staged_phase, writes_new, writes_old

API_KEY_RANDOM_LENGTH = 40  # 62**40 ~ 2**238


@transaction.atomic
def customer_create(*, name: str, email: str = "", phone: str = "") -> Customer:
    """A customer, their wallet account and its balance rows; the contact goes to the
    representations the tenant's `customer_contacts` phase writes."""
    phase = staged_phase(CONTACTS_MIGRATION)
    email, phone = email.strip(), phone.strip()
    customer = Customer.objects.create(name=name, **(contact_new_fields(email=email, phone=phone) if writes_new(phase) else {}))
    if writes_old(phase) and (email or phone):
        CustomerLegacyContact.objects.filter(pk=customer.pk).update(email=email, phone=phone)
    balance_rows_create(accounts=[Account.objects.create(kind=AccountKind.CUSTOMER, customer=customer)])
    return customer


@transaction.atomic
def merchant_create(*, name: str) -> Merchant:
    """A merchant, its account and its (sharded) balance rows."""
    merchant = Merchant.objects.create(name=name)
    balance_rows_create(accounts=[Account.objects.create(kind=AccountKind.MERCHANT, merchant=merchant)])
    return merchant


def merchant_settlement_delay_set(*, merchant: Merchant, days: int | None) -> Merchant:
    """Override the tenant's settlement delay for this merchant; None: the tenant's applies
    again. Locks: the merchant row (one UPDATE)."""
    if days is not None and not 0 <= days <= SETTLEMENT_DELAY_MAX_DAYS:
        raise InvalidRequest(f"the settlement delay is 0 to {SETTLEMENT_DELAY_MAX_DAYS} days, or none", param="settlement_delay_days")
    merchant.settlement_delay_days = days
    merchant.save(update_fields=["settlement_delay_days"])
    return merchant


def store_create(*, merchant: Merchant, name: str) -> Store:
    return Store.objects.create(merchant=merchant, name=name)


def terminal_create(*, store: Store, name: str) -> Terminal:
    return Terminal.objects.create(store=store, name=name)


@transaction.atomic
def staff_member_get_or_create(*, username: str) -> StaffMember:
    user, _ = get_user_model().objects.get_or_create(username=username, defaults={"is_staff": True})
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    return StaffMember.objects.get_or_create(user=user)[0]


@transaction.atomic
def api_key_create(*, principal: Customer | Merchant | Terminal | StaffMember) -> tuple[ApiKey, str]:
    """Mint a key for `principal`: the stored row and the raw key (shown once). Audited
    (never the key). Locks: none (INSERTs)."""
    principal_type, field = _PRINCIPALS[type(principal)]
    raw_key = KEY_PREFIXES[principal_type] + ids.random_token(API_KEY_RANDOM_LENGTH)
    api_key = ApiKey.objects.create(principal_type=principal_type, prefix=raw_key[:7], key_hash=api_key_hash(raw_key), **{field: principal})
    audit_record(action="api_key.create", target_type="api_key", target_id=api_key.pk, after=_api_key_state(api_key))
    return api_key, raw_key


ISSUE_PERMISSION = "wallets.issue_apikey"


def api_key_issue_check(*, issuer: User, principal: Customer | Merchant | Terminal | StaffMember) -> None:
    """May `issuer` mint or rotate a key for `principal`? No login may mint a key that could
    do more than itself: a customer's key (it spends their money) only a superuser, a
    staff member's (it acts with their future roles) their own login. Raises NotPermitted."""
    if not issuer.has_perm(ISSUE_PERMISSION):
        raise NotPermitted("minting or rotating API keys needs the wallets.issue_apikey permission")
    if isinstance(principal, Customer) and not issuer.is_superuser:
        raise NotPermitted("a customer's key spends the customer's money: only a superuser mints or rotates one")
    if isinstance(principal, StaffMember) and principal.user_id != issuer.pk:
        raise NotPermitted("a staff member's key is minted by their own login, or from the ops shell (manage.py create_staff_key)")


@transaction.atomic
def api_key_issue(*, issuer: User, principal: Customer | Merchant | Terminal | StaffMember) -> tuple[ApiKey, str]:
    """A staff member mints a key for `principal` (the admin API face), checked by
    `api_key_issue_check`. Locks: none (INSERTs)."""
    api_key_issue_check(issuer=issuer, principal=principal)
    return api_key_create(principal=principal)


def _api_key_state(api_key: ApiKey) -> dict[str, object]:
    """What the audit log keeps of a key: never its hash or secret."""
    return {
        "prefix": api_key.prefix, "principal_type": api_key.principal_type, "principal": api_key.principal_id,
        "expires_at": api_key.expires_at, "revoked_at": api_key.revoked_at,
    }


@transaction.atomic
def api_key_rotate(*, api_key: ApiKey, issuer: User, overlap: timedelta = timedelta(hours=24)) -> tuple[ApiKey, str]:
    """Mint a successor key (checked as minting is); the old one works for `overlap` more.
    A revoked or expired key is refused: that would hand a working key to whoever holds a
    dead one. Locks: the old key's row (UPDATE)."""
    if api_key.revoked_at is not None or (api_key.expires_at is not None and api_key.expires_at <= timezone.now()):
        raise InvalidState("this key is revoked or expired and cannot be rotated; create a new key")
    principal = api_key.customer or api_key.merchant or api_key.terminal or api_key.staff
    assert principal is not None
    api_key_issue_check(issuer=issuer, principal=principal)
    before = _api_key_state(api_key)
    new_key, raw_key = api_key_create(principal=principal)
    expires_at = timezone.now() + overlap
    if api_key.expires_at is None or api_key.expires_at > expires_at:
        api_key.expires_at = expires_at
        api_key.save(update_fields=["expires_at"])
        api_key_cache_invalidate()
    audit_record(
        action="api_key.rotate", target_type="api_key", target_id=api_key.pk, before=before,
        after={**_api_key_state(api_key), "successor": new_key.pk},
    )
    return new_key, raw_key


# last_used_at is advisory: one write per key per minute keeps a busy terminal's hot path
# free of an UPDATE per request.
LAST_USED_RESOLUTION_SECONDS = 60
_LAST_TOUCHED_MAX_ENTRIES = 100_000
_last_touched: dict[str, float] = {}


def api_key_last_used_touch(*, api_key: ApiKey) -> None:
    """Record that a key was used, at most once a minute per key (an in-process memo, then a
    conditional UPDATE for the other workers). Locks: the key row, when it writes."""
    now = time.monotonic()
    last = _last_touched.get(api_key.id)
    if last is not None and now - last < LAST_USED_RESOLUTION_SECONDS:
        return
    if len(_last_touched) >= _LAST_TOUCHED_MAX_ENTRIES:
        _last_touched.clear()
    _last_touched[api_key.id] = now
    stamp = timezone.now()
    ApiKey.objects.filter(pk=api_key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=stamp - timedelta(seconds=LAST_USED_RESOLUTION_SECONDS))
    ).update(last_used_at=stamp)


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke a key now (idempotent); audited. Locks: the key row (UPDATE)."""
    if api_key.revoked_at is None:
        before = _api_key_state(api_key)
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        api_key_cache_invalidate()
        audit_record(action="api_key.revoke", target_type="api_key", target_id=api_key.pk, before=before, after=_api_key_state(api_key))
    return api_key


_PRINCIPALS: dict[type, tuple[PrincipalType, str]] = {
    Customer: (PrincipalType.CUSTOMER, "customer"), Merchant: (PrincipalType.MERCHANT, "merchant"),
    Terminal: (PrincipalType.TERMINAL, "terminal"), StaffMember: (PrincipalType.STAFF, "staff"),
}
