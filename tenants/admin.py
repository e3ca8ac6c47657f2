"""The platform admin (public host): tenants, domains, platform users, beat schedules.

It is a separate AdminSite from the one tenant hosts serve: the public tables are on
every tenant's search_path, so registering them on the tenant admin would show one
tenant's staff every other tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db import DatabaseError, transaction
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django_tenants.utils import get_public_schema_name, schema_context

from tenants.models import Domain, Tenant
from tenants.services import tenant_creation_prepare, tenant_setup


class PlatformAdminSite(admin.AdminSite):
    site_header = "Tally platform"
    site_title = "Tally platform"
    index_title = "Tenants and platform settings"


platform_site = PlatformAdminSite(name="platform")
logger = logging.getLogger("tally.admin")


# Read-only panels the apps above add to a tenant's page (tenants imports none of them):
# each renders HTML from inside the tenant's schema, switched on or off, so the platform
# admin shows what a switched-off operator still holds (its hosts answer 404).
TENANT_PANELS: dict[str, Callable[[], SafeString]] = {}


def tenant_panel_register(*, title: str, render: Callable[[], SafeString]) -> None:
    TENANT_PANELS[title] = render


def _panel_render(schema: str, title: str, render: Callable[[], SafeString]) -> SafeString:
    """One panel, in a savepoint: a schema missing or not migrated (ProgrammingError) shows
    the panel as unavailable, and the page and the admin's transaction carry on."""
    try:
        with transaction.atomic():
            return render()
    except DatabaseError:
        logger.exception("tenant panel unavailable", extra={"tenant_schema": schema, "panel": title})
        return format_html("<p>{}</p>", "unavailable: the tenant's schema could not be read (missing or not migrated)")


class DomainInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Domain
    extra = 0


@admin.register(Tenant, site=platform_site)
class TenantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("schema_name", "name", "main_currency", "is_active", "idempotency_customer", "idempotency_terminal",
                    "idempotency_merchant", "idempotency_admin", "created")
    list_filter = ("is_active",)
    search_fields = ("schema_name", "name")
    inlines = [DomainInline]
    # A face's idempotency mode is switched from the tenant's own admin (Idempotency records ->
    # "Idempotency mode per face"), audited in that tenant's log; here it is shown only.
    readonly_fields = ("schema_name", "created", "idempotency_customer", "idempotency_terminal", "idempotency_merchant", "idempotency_admin",
                       "panels")
    fieldsets = (
        (None, {"fields": ("schema_name", "name", "is_active", "created")}),
        ("Money still in flight (read in the tenant's schema, switched on or off)", {"fields": ("panels",)}),
        ("Money", {"fields": ("main_currency", "currency_exponent", "points_earn_rate", "topup_bonus_rate", "carbon_grams_per_unit")}),
        ("Books", {"fields": ("time_zone",)}),
        ("Charging", {"fields": ("charge_by_customer_id", "refund_fee_policy")}),
        ("Merchant balances", {"fields": ("settlement_delay_days",)}),
        ("Idempotency rollout (per face)", {"fields": ("idempotency_customer", "idempotency_terminal", "idempotency_merchant", "idempotency_admin")}),
        ("Idempotency retention", {"fields": ("idempotency_replay_window_seconds", "idempotency_tombstone_window_seconds", "idempotency_wait_ms")}),
        ("Other", {"fields": ("extra_settings",)}),
    )

    @admin.display(description="in the tenant")
    def panels(self, obj: Tenant) -> SafeString:
        if obj.pk is None or obj.schema_name == get_public_schema_name() or not TENANT_PANELS:
            return format_html("{}", "-")
        with schema_context(obj.schema_name):
            rendered = [(title, _panel_render(obj.schema_name, title, render)) for title, render in TENANT_PANELS.items()]
        return format_html_join("", "<h3>{}</h3>{}", rendered)

    def get_queryset(self, request):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).exclude(schema_name="tenant_template")

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        # The schema is named once, when the tenant is added; renaming it would orphan it.
        # The platform's own row is never switched off: this admin would go with it.
        fields = super().get_readonly_fields(request, obj)
        if obj is None:
            return tuple(f for f in fields if f != "schema_name")
        return (*fields, "is_active") if obj.schema_name == get_public_schema_name() else fields

    def get_form(self, request, obj=None, change=False, **kwargs):  # type: ignore[no-untyped-def]
        form = super().get_form(request, obj, change, **kwargs)
        if "is_active" in form.base_fields:
            form.base_fields["is_active"].help_text = (
                "Unchecked: the operator is switched off. Its hosts answer 404 (API and admin; the PSP's webhooks still"
                " land), and beat stops its webhook relay and full reconciliation until it is switched on again. Card"
                " money stays safe: top-up recovery, card refunds and the PSP settlement check go on (its top-up queue"
                " is shown on this page)."
            )
        return form

    def add_view(self, request, form_url="", extra_context=None):  # type: ignore[no-untyped-def]
        if request.method == "POST":
            # Outside the admin's transaction: a template behind the code is migrated first
            # (a migration may build an index concurrently; the clone refuses it otherwise),
            # and the clone gets a new database session.
            tenant_creation_prepare()
        return super().add_view(request, form_url, extra_context)

    def save_related(self, request, form, formsets, change):  # type: ignore[no-untyped-def]
        super().save_related(request, form, formsets, change)
        if not change:  # the schema and the domains exist now; the same setup as tenant_create
            tenant_setup(tenant=form.instance)


@admin.register(Domain, site=platform_site)
class DomainAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("domain", "tenant", "is_primary")
    search_fields = ("domain",)


platform_site.register(User, UserAdmin)
platform_site.register(Group, GroupAdmin)


def admin_sites_split() -> None:
    """Move the public-schema models other apps registered on the tenant admin to the
    platform admin. Idempotent; called once the URLconfs (and so autodiscovery) load."""
    from django_celery_beat import admin as beat_admin  # noqa: F401 - ensures registration happened
    from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule

    for model in (PeriodicTask, ClockedSchedule, CrontabSchedule, IntervalSchedule, SolarSchedule):
        if admin.site.is_registered(model):
            model_admin = admin.site.get_model_admin(model)
            admin.site.unregister(model)
            if not platform_site.is_registered(model):
                platform_site.register(model, type(model_admin))
