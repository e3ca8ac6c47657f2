"""Middleware that needs more than one app: the composition root wires it."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotFound

from apikit.errors import error_response, internal_error_response, is_api_path
from config.observability import Middleware
from tenants.middleware import CachedTenantMiddleware
from wallets.audit import AuditOrigin, audit_origin_set
from wallets.transactions import is_connection_failure


class FailClosedTenantMiddleware(CachedTenantMiddleware):
    """Tenant by host; with PostgreSQL unreachable, 503 in the error envelope (SPEC 5)
    instead of a crash page, before any view runs."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        try:
            return super().process_request(request)
        except DatabaseError as exc:
            if not is_connection_failure(exc):
                raise
            return error_response(request, exc)  # 503 unavailable, Retry-After


def tenant_not_found(request: HttpRequest) -> HttpResponse:
    """DEFAULT_NOT_FOUND_TENANT_VIEW: an unknown host is a plain 404 (the envelope on
    /v1/), never django-tenants' message naming the host and the view."""
    if is_api_path(request):
        return error_response(request, Http404())
    return HttpResponseNotFound(b"Not found", content_type="text/plain")


_STATUS_EXCEPTIONS: dict[int, Callable[[], Exception]] = {400: SuspiciousOperation, 403: PermissionDenied, 404: Http404}


class ApiErrorEnvelopeMiddleware(Middleware):
    """Every /v1/ error is the SPEC envelope, DEBUG on or off: Django's technical pages (which
    list routes and internals) are replaced by the envelope with the same status."""

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or not is_api_path(request):
            return response
        if str(response.get("Content-Type", "")).startswith("application/json"):
            return response
        exception = _STATUS_EXCEPTIONS.get(response.status_code)
        if exception is None:
            return internal_error_response(request) if response.status_code >= 500 else response
        return error_response(request, exception())


class AuditOriginMiddleware(Middleware):
    """Tells the audit log (wallets.audit) a request's address, id and user; the user (session
    or API principal) is resolved only when an entry is written."""

    def __call__(self, request: HttpRequest) -> HttpResponse:
        origin = AuditOrigin(
            via="api" if is_api_path(request) else "admin",
            ip=request.META.get("REMOTE_ADDR") or None,
            request_id=str(getattr(request, "request_id", "")),
            user=lambda: getattr(request, "user", None),
        )
        with audit_origin_set(origin):
            return self.get_response(request)
