"""Tenant resolution by host with a short in-process cache (TENANT_CACHE_SECONDS, README.md)
instead of django-tenants' Domain query on every request. An unknown host is never cached.

A switched-off tenant is served as an unknown host (README.md: what goes on meanwhile), so it
takes no payments whose webhooks would wait. Served anyway: the public tenant (the platform
admin, where a tenant is switched on again) and the PSP's webhooks (top-ups already charged).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save
from django.http import HttpRequest, HttpResponse
from django_tenants.middleware.main import TenantMainMiddleware
from django_tenants.utils import get_public_schema_name, remove_www

from tenants.models import Domain, Tenant

# What a switched-off tenant's host still serves: the PSP's answers about charges it made.
SERVED_WHEN_SWITCHED_OFF = ("/v1/psp/webhooks/",)

_cache: dict[str, tuple[Tenant, float]] = {}
_lock = threading.Lock()


def tenant_cache_clear(**_: Any) -> None:
    with _lock:
        _cache.clear()


def _tenant_changed(**_: Any) -> None:
    # Now, for reads later in this transaction, and again once it commits, so a value
    # read while the change was uncommitted is not served after it.
    tenant_cache_clear()
    transaction.on_commit(tenant_cache_clear)


for _model in (Tenant, Domain):
    post_save.connect(_tenant_changed, sender=_model, dispatch_uid=f"tenant-cache-save-{_model.__name__}")
    post_delete.connect(_tenant_changed, sender=_model, dispatch_uid=f"tenant-cache-delete-{_model.__name__}")


class CachedTenantMiddleware(TenantMainMiddleware):  # type: ignore[misc]  # django-tenants is untyped
    """django-tenants' middleware with a per-process host -> tenant cache (cleared on save).
    Host names are matched case-insensitively (DNS names are)."""

    @staticmethod
    def hostname_from_request(request: HttpRequest) -> str:
        return str(remove_www(request.get_host().split(":")[0])).lower()

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        response: HttpResponse | None = super().process_request(request)
        tenant = getattr(request, "tenant", None)
        if response is not None or tenant is None or tenant.is_active or tenant.schema_name == get_public_schema_name():
            return response
        if request.path.startswith(SERVED_WHEN_SWITCHED_OFF):
            return None
        connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
        return self.no_tenant_found(request, self.hostname_from_request(request))  # type: ignore[no-any-return]

    def get_tenant(self, domain_model: Any, hostname: str) -> Tenant:
        ttl = float(getattr(settings, "TENANT_CACHE_SECONDS", 10))
        now = time.monotonic()
        hit = _cache.get(hostname) if ttl > 0 else None
        if hit is not None and hit[1] > now:
            return hit[0]
        tenant: Tenant = super().get_tenant(domain_model, hostname)
        if ttl > 0:
            with _lock:
                _cache[hostname] = (tenant, now + ttl)
        return tenant
