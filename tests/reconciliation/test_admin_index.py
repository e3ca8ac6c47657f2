"""The tenant admin's index as a person reads it: model names in English (no "Ledger
entrys", "Psp webhook events", "Api keys"), and the reconciliation dashboard with its charts
one click away."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tests.reconciliation.conftest import RECON_TENANT

PASSWORD = "pw-123456"
ACRONYMS = ("API", "PSP", "CSV", "URL", "ID")


def _client(username: str) -> Client:
    client = Client(HTTP_HOST=RECON_TENANT["domain"])
    assert client.login(username=username, password=PASSWORD)
    return client


@pytest.fixture
def root(recon_tenant: Any) -> Client:
    get_user_model().objects.create_superuser(username="index-root", password=PASSWORD)
    return _client("index-root")


def _naive(word: str) -> bool:
    """An English plural Django's default (verbose name + "s") gets wrong."""
    return bool(re.search(r"[^aeiou]ys$|(?:ch|sh|ss|x)s$", word))


def test_every_model_on_the_tenant_admin_has_an_english_plural() -> None:
    for model in admin.site._registry:
        plural = str(model._meta.verbose_name_plural)
        for word in plural.split():
            assert not _naive(word), f"{model.__name__}: {plural!r}"
            assert word.upper() not in ACRONYMS or word == word.upper(), f"{model.__name__}: {plural!r}"


def test_admin_index_reads_as_english(root: Client) -> None:
    page = root.get("/admin/")
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("Ledger entries", "PSP webhook events", "API keys", "Webhook deliveries", "Top-ups", "Audit entries"):
        assert f">{name}</a>" in html, name
    names = re.findall(r'<th scope="row"[^>]*>\s*<a href="[^"]*"[^>]*>([^<]+)</a>', html)
    assert len(names) > 20
    for name in names:
        assert not any(_naive(word) for word in name.split()), name
        assert not re.search(r"\b(?:Api|Psp|Csv|Url)\b", name), name


def test_the_dashboard_is_one_click_from_the_admin_index(world: dict[str, Any], root: Client) -> None:
    html = root.get("/admin/").content.decode()
    links = re.findall(r'<a href="([^"]+)"[^>]*>Dashboard \(charts\)</a>', html)
    assert links == ["/admin/reconciliation/reconciliationrun/dashboard/"]
    dashboard = root.get(links[0])
    assert dashboard.status_code == 200
    assert 'id="reconciliation-dashboard"' in dashboard.content.decode()
    assert '<svg class="tally-chart' in dashboard.content.decode()


def test_the_dashboard_link_needs_the_view_permission(recon_tenant: Any) -> None:
    user = get_user_model().objects.create_user(username="index-staff", password=PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_ledgerentry"))
    assert "Dashboard (charts)" not in _client("index-staff").get("/admin/").content.decode()
    user.user_permissions.add(Permission.objects.get(codename="view_reconciliationrun"))
    assert "Dashboard (charts)" in _client("index-staff").get("/admin/").content.decode()
