"""The tenant admin site (`admin.site`, made default by `TallyAdminConfig`): Django's, with
Tally's titles and the reconciliation dashboard listed first in the Reconciliation app."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

DASHBOARD_URL_NAME = "reconciliation_dashboard"
DASHBOARD_PERMISSION = "reconciliation.view_reconciliationrun"


class TallyAdminSite(admin.AdminSite):
    site_header = site_title = "Tally back office"
    index_title = "Wallets, payments, webhooks and the audit log"

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        app_list = super().get_app_list(request, app_label)
        for app in app_list:
            if app["app_label"] == "reconciliation" and request.user.has_perm(DASHBOARD_PERMISSION):
                try:
                    url = reverse(f"{self.name}:{DASHBOARD_URL_NAME}", current_app=self.name)
                except NoReverseMatch:
                    break
                app["models"].insert(0, {
                    "name": "Dashboard (charts)", "object_name": "Dashboard", "admin_url": url, "add_url": None,
                    "view_only": True, "perms": {"view": True},
                })
        return app_list


class TallyAdminConfig(AdminConfig):
    default_site = "config.admin_site.TallyAdminSite"
