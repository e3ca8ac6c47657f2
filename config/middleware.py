"""Middleware that needs more than one app: the composition root wires it."""

from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from payments.api.errors import error_response
from tenants.middleware import CachedTenantMiddleware
from wallets.transactions import is_connection_failure


class FailClosedTenantMiddleware(CachedTenantMiddleware):
    """Tenant by host; with PostgreSQL unreachable, 503 in the error envelope (SPEC 5)
    instead of a crash page, before any view runs."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        try:
            return super().process_request(request)  # type: ignore[no-any-return]
        except DatabaseError as exc:
            if not is_connection_failure(exc):
                raise
            return error_response(request, exc)  # 503 unavailable, Retry-After
