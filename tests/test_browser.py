"""The back office in a real browser: headless Chromium against a live gunicorn
serving the demo tenant that `make run` seeds, logged in with the login the seed prints.

Opens a payment, refunds part of it through the admin's staff action (confirmation page),
sees the refund and its audit entry, runs a reconciliation from the dashboard and sees its
charts render, and checks the admin's CSS loaded (whitenoise).
Screenshots go to var/artifacts/browser/ (the path is printed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django_tenants.utils import schema_context

from devtools.demo_seed import DEMO_DOMAIN, DEMO_SCHEMA, demo_seed
from payments.models import Payment, Refund
from payments.services.charges import payment_create_with_token
from payments.services.tokens import payment_token_create
from tests.browser import admin_login, artifacts_dir, browser_page, screenshot, stylesheet_loaded
from tests.live import gunicorn_running, static_collect
from wallets.models import AuditEntry, Customer, Terminal


@pytest.fixture
def seeded_demo(django_db_setup: None, django_db_blocker: Any, tmp_path: Path, settings: Any) -> dict[str, Any]:
    """What `make run` seeds (committed: the browser talks to another process). Passwords are
    hashed as the server (local settings) checks them, not with the tests' fast hasher."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    with django_db_blocker.unblock():
        seeded = demo_seed(keys_file=tmp_path / "demo_keys.json")
        with schema_context(DEMO_SCHEMA):
            alice = Customer.objects.get(name="Alice")
            _, token = payment_token_create(customer=alice)
            payment = payment_create_with_token(terminal=Terminal.objects.first(), customer_token=token, asset_code="JPY", amount=1200)
        return {**seeded, "payment": payment.pk}


def test_staff_refund_in_the_browser(seeded_demo: dict[str, Any], django_db_blocker: Any, tmp_path: Path) -> None:
    shots = artifacts_dir("browser")
    static_root = tmp_path / "static"
    static_collect(static_root=static_root)
    host = DEMO_DOMAIN
    payment_id = seeded_demo["payment"]
    # Eager Celery: "Run now" runs the reconciliation on commit inside the request, as a
    # worker would moments later (no worker process in this test).
    with (
        gunicorn_running(static_root=static_root, log=shots / "gunicorn.log", CELERY_TASK_ALWAYS_EAGER="true") as port,
        browser_page(host_map={host: "127.0.0.1"}) as page,
    ):
        base = f"http://{host}:{port}"
        css: list[tuple[str, int]] = []
        page.on("response", lambda r: css.append((r.url, r.status)) if r.url.endswith(".css") else None)

        admin_login(page, base_url=base, username="admin", password=seeded_demo["admin_password"])
        screenshot(page, shots, "01-admin-index")
        assert stylesheet_loaded(page, "/static/admin/css/base.css"), css
        assert all(status == 200 for _, status in css) and css, css
        # The admin's header colour comes from base.css: unstyled, it would be transparent.
        assert page.evaluate("getComputedStyle(document.querySelector('#header')).backgroundColor") not in ("rgba(0, 0, 0, 0)", "")

        page.goto(f"{base}/admin/payments/payment/{quote(payment_id)}/change/")
        assert "¥1,200" in page.content()
        screenshot(page, shots, "02-payment")
        page.click("a.staff-action:has-text('Refund')")
        page.wait_for_selector("#staff-action-form")
        page.fill("#id_amount", "500")
        page.fill("#id_reason", "browser test: partial refund")
        screenshot(page, shots, "03-refund-confirmation")
        page.click("input[name=confirm]")
        page.wait_for_url(f"{base}/admin/payments/payment/{quote(payment_id)}/change/")
        body = page.content()
        screenshot(page, shots, "04-payment-refunded")
        assert "ref_" in body and "¥500" in body and "(left: ¥700)" in body

        page.click("text=audit log")
        page.wait_for_selector("#result_list")
        listing = page.content()
        screenshot(page, shots, "05-audit-log")
        assert "admin.refund" in listing and "user:admin" in listing
        page.click("#result_list tbody tr:first-child th a, #result_list tbody tr:first-child td a")
        page.wait_for_selector("text=browser test: partial refund")
        entry_page = page.content()
        screenshot(page, shots, "06-audit-entry")
        assert stylesheet_loaded(page, "/static/admin/css/base.css")

        page.goto(f"{base}/admin/reconciliation/reconciliationrun/dashboard/")
        page.click("#reconciliation-run-now button")
        page.wait_for_selector("#latest-run-status")
        screenshot(page, shots, "07-reconciliation-dashboard")
        assert page.inner_text("#latest-run-status").strip() and page.locator("#findings-by-kind").count() == 1
        widths = page.evaluate("[...document.querySelectorAll('svg.tally-chart')].map(c => c.getBoundingClientRect().width)")
        assert widths and all(width > 100 for width in widths), widths  # drawn, not collapsed
        assert page.locator("#volume-charts svg.tally-chart").count() >= 1
        assert stylesheet_loaded(page, "/static/admin/css/base.css")
    # The browser's event loop is closed: the ORM may run again.
    with django_db_blocker.unblock(), schema_context(DEMO_SCHEMA):
        refund = Refund.objects.get(payment_id=payment_id)
        assert Payment.objects.get(pk=payment_id).amount_refunded == 500
        entry = AuditEntry.objects.get(action="admin.refund", target_id=payment_id)
    assert refund.pk in body and refund.pk in entry_page and entry.actor == "user:admin" and entry.via == "admin"
    assert sorted(p.name for p in shots.glob("*.png")) == [
        "01-admin-index.png", "02-payment.png", "03-refund-confirmation.png", "04-payment-refunded.png", "05-audit-log.png",
        "06-audit-entry.png", "07-reconciliation-dashboard.png",
    ]


def test_a_missing_chromium_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import browser

    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y chromium"):
        browser.chromium_required()
