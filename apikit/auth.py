"""`Authorization: Bearer <key>` -> Principal, and the per-face gate (SPEC 4)."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from apikit.principal import FACE_PRINCIPAL_TYPES, Principal, principal_from_api_key
from apikit.throttling import auth_failure_wait_seconds
from wallets.keycache import ApiKeyCacheHit, api_key_cache_fill, api_key_cache_get
from wallets.keycache import api_key_cache_confirm as api_key_cache_keys_confirm
from wallets.models import ApiKey, StaffMember
from wallets.selectors import staff_login_active
from wallets.services.principals import api_key_last_used_touch

logger = logging.getLogger("tally.api")

# Real keys are ~43 characters; anything far longer is junk we need not even hash.
MAX_KEY_LENGTH = 128


class ApiKeyAuthentication(BaseAuthentication):
    """A key from the per-process cache (wallets.keycache) comes unconfirmed: only views that
    declare `api_key_cache_confirmed` get one, and they call `api_key_cache_confirm` first."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Principal, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        raw_key = raw_key.strip()
        if scheme.lower() != "bearer" or not raw_key or len(raw_key) > MAX_KEY_LENGTH or not raw_key.isascii():
            _refuse(request, raw_key, "invalid API key")
        view = (request.parser_context or {}).get("view")
        hit = api_key_cache_get(raw_key=raw_key) if getattr(view, "api_key_cache_confirmed", False) else None
        if hit is not None:
            request._request.api_key_cache_hit = hit  # type: ignore[attr-defined]
            return principal_from_api_key(hit.api_key), hit.api_key
        api_key = api_key_cache_fill(raw_key=raw_key)
        if api_key is None:
            _refuse(request, raw_key, "invalid, revoked or expired API key")
        api_key_last_used_touch(api_key=api_key)
        return principal_from_api_key(api_key), api_key

    def authenticate_header(self, request: Request) -> str:
        # A value here makes DRF answer 401 (not 403) to a missing or bad key.
        return 'Bearer realm="tally"'


def _refuse(request: Request, raw_key: str, message: str) -> NoReturn:
    """401, or 429 once failed authentications from this IP or with this key prefix are over their limit."""
    wait = auth_failure_wait_seconds(request, key_prefix=raw_key[:7] if raw_key.isascii() else "?")
    if wait is not None:
        raise exceptions.Throttled(wait=wait)
    raise exceptions.AuthenticationFailed(message)


def api_key_cache_confirm(request: Request, *, epoch_now: bytes | None) -> None:
    """Trust a key from the cache only if the tenant's key epoch is still the one it was
    cached under (`epoch_now`; None: Redis did not answer). Otherwise the key is read again
    from PostgreSQL and replaces the principal, or the request is refused 401."""
    hit = getattr(request._request, "api_key_cache_hit", None)
    if not isinstance(hit, ApiKeyCacheHit):
        return
    del request._request.api_key_cache_hit  # type: ignore[attr-defined]
    api_key = api_key_cache_keys_confirm(hit=hit, epoch_now=epoch_now)
    if api_key is None:
        request.user, request.auth = None, None  # type: ignore[assignment]
        _refuse(request, request.META.get("HTTP_AUTHORIZATION", "").partition(" ")[2].strip(), "invalid, revoked or expired API key")
    if api_key is not hit.api_key:
        request.user, request.auth = principal_from_api_key(api_key), api_key  # type: ignore[assignment]
    api_key_last_used_touch(api_key=api_key)


class FacePermission(BasePermission):
    """Each face accepts its own principal type only; the rest get 403."""

    message = "this API key cannot be used on this face"

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, Principal):
            raise exceptions.NotAuthenticated("missing API key: send Authorization: Bearer <key>")
        if principal.type == FACE_PRINCIPAL_TYPES[view.face]:
            return True
        # Refused before the throttles read the key epoch: a key from the cache is checked
        # against PostgreSQL first, so a revoked key is told 401 here too, never 403.
        api_key_cache_confirm(request, epoch_now=None)
        return False


class StaffRolePermission(BasePermission):
    """The admin face, after FacePermission: a staff key acts with its login's roles, read
    from PostgreSQL at each request (never cached), so a role change holds from the next
    request on. Each action names the permission it needs (`AdminViewSet.action_permissions`);
    an action with none is refused."""

    def has_permission(self, request: Request, view: Any) -> bool:
        staff = request.user.obj  # type: ignore[union-attr]
        assert isinstance(staff, StaffMember)
        login = staff_login_active(staff=staff)
        if login is None:
            raise exceptions.AuthenticationFailed("this staff member's login is deactivated: their keys no longer work")
        request._request.staff_login = login  # type: ignore[attr-defined]  # the view passes it on as the acting login
        if view.action is None:  # a method this route does not serve: 405 follows, nothing runs
            return True
        needed = view.action_permissions.get(view.action)
        if needed is not None and login.has_perm(needed):
            return True
        api_key_cache_confirm(request, epoch_now=None)  # a revoked key from the cache is told 401, never 403
        self.message = f"your role does not allow this: it needs the {needed or 'a'} permission"
        return False
