"""The endpoints the staged migrations serve: a customer's contact (set, clear, keep) and
the merchant balance history (daily totals), plus the state's read-only admin page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.test import Client

from payments.services.adjustments import adjustment_create
from tenants.models import Tenant
from tests.api.conftest import Api, World, error_of
from wallets.models import CustomerLegacyContact, StagedMigrationState
from wallets.staged.phases import staged_phase_forget


def test_a_customer_sets_clears_and_keeps_their_contact(api: Api, world: World) -> None:
    key = world.customer.key
    r = api.get("/v1/customer/contact", key)
    assert r.status_code == 200 and r.json() == {
        "object": "contact", "customer": world.customer.id, "email": "alice@example.com", "phone": "+81 90 1234 5678",
    }
    r = api.post("/v1/customer/contact", key, {"email": "alice@new.example.com"})  # phone left out: unchanged
    assert r.status_code == 200 and (r.json()["email"], r.json()["phone"]) == ("alice@new.example.com", "+81 90 1234 5678")
    r = api.post("/v1/customer/contact", key, {"phone": None})  # null clears
    assert r.status_code == 200 and (r.json()["email"], r.json()["phone"]) == ("alice@new.example.com", "")
    assert CustomerLegacyContact.objects.get(pk=world.customer.id).phone == ""
    r = api.post("/v1/customer/contact", key, {"email": "not an email"})
    assert r.status_code == 400 and error_of(r)["param"] == "email"
    assert api.get("/v1/customer/contact", key).json()["email"] == "alice@new.example.com"  # the bad request changed nothing


def test_staff_set_a_customers_contact(api: Api, world: World) -> None:
    body = {"email": "bob@example.com", "phone": "+44 20 7946 0000"}
    r = api.post(f"/v1/admin/customers/{world.customer2.id}/contact", world.staff.key, body)
    assert r.status_code == 200 and (r.json()["email"], r.json()["phone"]) == ("bob@example.com", "+44 20 7946 0000")
    listed = api.get("/v1/admin/customers", world.staff.key).json()["data"]
    assert {c["id"]: c["email"] for c in listed}[world.customer2.id] == "bob@example.com"
    assert api.post("/v1/admin/customers/cus_nope/contact", world.staff.key, {"email": None}).status_code == 404
    found = api.get("/v1/admin/customers", world.staff.key, {"email": "BOB@example.com"}).json()["data"]
    assert [c["id"] for c in found] == [world.customer2.id]
    assert api.get("/v1/admin/customers", world.staff.key, {"email": "nobody@example.com"}).json()["data"] == []


def test_the_merchant_balance_history_is_the_days_totals(api: Api, world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    paid = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1200})
    assert paid.status_code == 201, paid.content
    assert api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid.json()["id"], "amount": 200}).status_code == 201
    r = api.get("/v1/merchant/balance/history", world.merchant.key, {"asset": "JPY"})
    assert r.status_code == 200, r.content
    today = datetime.now(UTC).date().isoformat()
    assert r.json() == {
        "object": "list", "next_cursor": None,
        "data": [{"object": "merchant_daily_total", "day": today, "asset": "JPY", "credited": 1200, "debited": 200, "net": 1000, "entries": 2}],
    }
    # Another merchant sees only its own (none).
    assert api.get("/v1/merchant/balance/history", world.merchant2.key).json()["data"] == []
    # A window wider than a page (366 days) is paged, newest first, by a cursor.
    long_ago = (datetime.now(UTC) - timedelta(days=400)).date().isoformat()
    older = (datetime.now(UTC) - timedelta(days=366)).date().isoformat()
    for params in ({"day_from": long_ago}, {"day_from": long_ago, "day_to": today}):  # day_to defaults to today
        first = api.get("/v1/merchant/balance/history", world.merchant.key, params)
        assert first.status_code == 200 and first.json()["next_cursor"] == older, params
        assert [t["day"] for t in first.json()["data"]] == [today]
        rest = api.get("/v1/merchant/balance/history", world.merchant.key, {**params, "cursor": older}).json()
        assert rest == {"object": "list", "data": [], "next_cursor": None}
    empty = api.get("/v1/merchant/balance/history", world.merchant.key, {"day_from": today, "day_to": older})
    assert empty.status_code == 200 and empty.json() == {"object": "list", "data": [], "next_cursor": None}  # an empty range
    bad = api.get("/v1/merchant/balance/history", world.merchant.key, {"day_to": "yesterday"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "day_to"
    for far in ("9999-12-31", "0001-01-01"):  # no date arithmetic overflows into a 500
        bad = api.get("/v1/merchant/balance/history", world.merchant.key, {"day_to": far})
        assert bad.status_code == 400 and error_of(bad)["param"] == "day_to", far


def test_the_state_is_in_the_admin_read_only(world: World, tenant: Tenant) -> None:
    # A new tenant starts contacts contracted: its row exists, put here mid-migration.
    StagedMigrationState.objects.update_or_create(name="customer_contacts", defaults={"phase": "expanded", "rows_total": 10, "rows_done": 4})
    get_user_model().objects.create_superuser(username="staged-root", password="pw-123456")
    admin = Client(HTTP_HOST=world.host)
    assert admin.login(username="staged-root", password="pw-123456")
    page = admin.get("/admin/wallets/stagedmigrationstate/")
    assert page.status_code == 200 and b"customer_contacts" in page.content and b"4/10" in page.content
    assert admin.get("/admin/wallets/stagedmigrationstate/add/").status_code == 403
    change = admin.post("/admin/wallets/stagedmigrationstate/customer_contacts/change/", {"phase": "contracted"})
    assert change.status_code == 403 and StagedMigrationState.objects.get(name="customer_contacts").phase == "expanded"
    staged_phase_forget()  # the row is rolled back with the test; no process may keep its phase
