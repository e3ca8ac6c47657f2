"""Reads of the tenants app."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet

from tenants.models import Tenant


def tenant_current() -> Tenant:
    """The tenant whose schema is active. `connection.tenant` is the real row when the
    middleware or `set_tenant` set it (no query); under `schema_context` it is a stand-in
    without settings, so the row is read."""
    tenant = getattr(connection, "tenant", None)
    if isinstance(tenant, Tenant):
        return tenant
    schema_name: str = getattr(connection, "schema_name")  # noqa: B009 - set by django-tenants' backend
    return cast(Tenant, Tenant.objects.get(schema_name=schema_name))


def tenant_extra_settings_fresh() -> dict[str, Any]:
    """The current tenant's `extra_settings`, read from its row now: for controls (the
    maker-checker threshold), which must not wait for the host cache (TENANT_CACHE_SECONDS)."""
    schema_name: str = getattr(connection, "schema_name")  # noqa: B009 - set by django-tenants' backend
    extra = Tenant.objects.filter(schema_name=schema_name).values_list("extra_settings", flat=True).first()
    return dict(extra or {})


def tenant_rate(tenant: Tenant, name: str) -> Decimal:
    """A rate setting of the tenant (points_earn_rate, carbon_grams_per_unit,
    topup_bonus_rate) as a Decimal; a float there is a bug, refused."""
    value = getattr(tenant, name)
    if isinstance(value, float):
        raise TypeError(f"tenant setting {name} is a float")
    return Decimal(value)


def tenant_schemas_active() -> list[str]:
    """Schemas of the active tenants (not public, not the template), for business work."""
    return _tenant_schemas(Tenant.objects.filter(is_active=True))


def tenant_schemas_all() -> list[str]:
    """Schemas of every tenant, switched on or off (not public, not the template), for the
    commands that keep data right: a tenant switched on again has the data the code expects."""
    return _tenant_schemas(Tenant.objects.all())


def _tenant_schemas(tenants: QuerySet[Tenant]) -> list[str]:
    excluded = ["public", str(settings.TENANT_BASE_SCHEMA)]
    return [str(s) for s in tenants.exclude(schema_name__in=excluded).values_list("schema_name", flat=True)]


def tenant_zone() -> ZoneInfo:
    """The current tenant's time zone (`Tenant.time_zone`): where its days and months begin."""
    return ZoneInfo(tenant_current().time_zone)
