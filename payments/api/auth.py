"""`Authorization: Bearer <key>` -> Principal, and the per-face gate (SPEC 4)."""

from __future__ import annotations

import logging
from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from payments.api.principal import FACE_PRINCIPAL_TYPES, Principal, principal_from_api_key
from payments.api.throttling import auth_failure_wait_seconds
from wallets.models import ApiKey
from wallets.selectors import api_key_get_active_cached
from wallets.services.principals import api_key_last_used_touch

logger = logging.getLogger("tally.api")

# Real keys are ~43 characters; anything far longer is junk we need not even hash.
MAX_KEY_LENGTH = 128


class ApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Principal, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        raw_key = raw_key.strip()
        if scheme.lower() != "bearer" or not raw_key or len(raw_key) > MAX_KEY_LENGTH or not raw_key.isascii():
            self._failed(request, raw_key)
            raise exceptions.AuthenticationFailed("invalid API key")
        api_key = api_key_get_active_cached(raw_key=raw_key)
        if api_key is None:
            self._failed(request, raw_key)
            raise exceptions.AuthenticationFailed("invalid, revoked or expired API key")
        api_key_last_used_touch(api_key=api_key)
        return principal_from_api_key(api_key), api_key

    @staticmethod
    def _failed(request: Request, raw_key: str) -> None:
        """Throttle failed authentication per IP and key prefix: 429 once over the limit."""
        wait = auth_failure_wait_seconds(request, key_prefix=raw_key[:7] if raw_key.isascii() else "?")
        if wait is not None:
            raise exceptions.Throttled(wait=wait)

    def authenticate_header(self, request: Request) -> str:
        # A value here makes DRF answer 401 (not 403) to a missing or bad key.
        return 'Bearer realm="tally"'


class FacePermission(BasePermission):
    """Each face accepts its own principal type only; the rest get 403."""

    message = "this API key cannot be used on this face"

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, Principal):
            raise exceptions.NotAuthenticated("missing API key: send Authorization: Bearer <key>")
        return principal.type == FACE_PRINCIPAL_TYPES[view.face]
