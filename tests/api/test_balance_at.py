"""`?at=` on the customer's wallet and the merchant's balance, and the admin face's balances
of any customer or merchant at an instant (wallets/books.py): each asset's balance as of the
instant from the ledger; the bad `at`s a client may send, each a 400 naming `at`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tenants.models import Tenant
from tests.api.conftest import Api, World, error_of
from wallets.models import Account, SystemRole
from wallets.services.ledger import Leg, ledger_post


def _jpy(body: dict[str, Any]) -> dict[str, Any]:
    return next(line for line in body["balances"] if line["asset"] == "JPY")


def _post(account: Account, amount: int, created: datetime, reference: str) -> None:
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    ledger_post(kind="adjustment", reference=reference, legs=[Leg(account, "JPY", amount), Leg(source, "JPY", -amount)], created=created)


def test_the_wallet_and_the_merchant_balance_answer_as_of_an_instant(api: Api, world: World, tenant: Tenant) -> None:
    wallet = Account.objects.get(customer_id=world.customer.id)
    shop = Account.objects.get(merchant_id=world.merchant.id)
    t0 = datetime.now(UTC) - timedelta(days=3)
    _post(wallet, 1_000, t0, "adj_w1")
    _post(wallet, 250, t0 + timedelta(days=1), "adj_w2")
    _post(shop, 400, t0 + timedelta(hours=5), "adj_m1")
    cases = [  # (at, wallet's JPY, merchant's JPY)
        (t0 - timedelta(microseconds=1), 0, 0),
        (t0, 1_000, 0),  # an entry created at `at` is included
        ((t0 + timedelta(hours=5)).astimezone(datetime.now().astimezone().tzinfo), 1_000, 400),
        (t0 + timedelta(days=1, seconds=-1), 1_000, 400),
        (t0 + timedelta(days=2), 1_250, 400),
    ]
    for at, in_wallet, in_shop in cases:
        at_text = at.isoformat()
        body = api.get("/v1/customer/wallet", world.customer.key, {"at": at_text}).json()
        assert datetime.fromisoformat(body["at"].replace("Z", "+00:00")) == at
        assert _jpy(body) == {"asset": "JPY", "balance": in_wallet, "available": None, "held": None}, at_text
        body = api.get("/v1/merchant/balance", world.merchant.key, {"at": at_text}).json()
        assert _jpy(body) == {"asset": "JPY", "balance": in_shop, "available": None, "pending": None, "held": None}, at_text
        for path, party, expected in (("customers", world.customer.id, in_wallet), ("merchants", world.merchant.id, in_shop)):
            r = api.get(f"/v1/admin/{path}/{party}/balances", world.staff.key, {"at": at_text})
            assert r.status_code == 200, r.content
            assert r.json()["object"] == "balances_at" and _jpy(r.json()) == {"asset": "JPY", "balance": expected}
    now = api.get("/v1/customer/wallet", world.customer.key).json()
    assert now["at"] is None and _jpy(now)["balance"] == 1_250 and _jpy(now)["available"] == 1_250
    admin_now = api.get(f"/v1/admin/customers/{world.customer.id}/balances", world.staff.key).json()
    assert _jpy(admin_now)["balance"] == 1_250


def test_an_instant_before_the_account_existed_answers_zero_in_every_asset(api: Api, world: World, tenant: Tenant) -> None:
    _post(Account.objects.get(customer_id=world.customer.id), 500, datetime.now(UTC) - timedelta(minutes=1), "adj_z")
    for at in ("2001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00"):
        body = api.get("/v1/customer/wallet", world.customer.key, {"at": at}).json()
        assert body["balances"] and all(line["balance"] == 0 for line in body["balances"]), body


@pytest.mark.parametrize(("at", "says"), [
    ("yesterday", "invalid"),
    ("2026-13-01T00:00:00Z", "invalid"),
    ("2026-11-30T12:00:00", "offset"),  # a wall clock alone names no instant
    ("2026-11-30", "offset"),
    ("9999-12-31T23:59:59-05:00", "future"),
    ("", "invalid"),
])
def test_a_bad_at_is_a_400_naming_it(api: Api, world: World, tenant: Tenant, at: str, says: str) -> None:
    future = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    for value, expect in ((at, says), (future, "future")):
        for path, key in (("/v1/customer/wallet", world.customer.key), ("/v1/merchant/balance", world.merchant.key),
                          (f"/v1/admin/merchants/{world.merchant.id}/balances", world.staff.key)):
            r = api.get(path, key, {"at": value})
            assert r.status_code == 400, (path, value, r.content)
            error = error_of(r)
            assert error["param"] == "at", error
            if expect == "offset":
                assert "offset" in error["message"]
            if expect == "future":
                assert "future" in error["message"]


def test_an_unknown_parameter_or_party_is_refused(api: Api, world: World, tenant: Tenant) -> None:
    r = api.get("/v1/customer/wallet", world.customer.key, {"as_of": "2026-11-30T00:00:00Z"})
    assert r.status_code == 400 and error_of(r)["param"] == "as_of"
    r = api.get("/v1/admin/customers/cus_doesnotexist0000000000/balances", world.staff.key)
    assert r.status_code == 404


def test_the_back_office_shows_an_accounts_balance_as_of_a_local_time(world: World, tenant: Tenant) -> None:
    """From the customer's page, "balance as of": a wall clock read in the tenant's zone (UTC
    here), or an instant with its offset; a future or malformed one is said, not a 500."""
    from django.contrib.auth.models import Permission
    from django.test import Client
    from django.urls import reverse

    from devtools.demo_seed import staff_login_ensure
    from tests.conftest import TENANT_A

    wallet = Account.objects.get(customer_id=world.customer.id)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    _post(wallet, 700, t0, "adj_bo1")
    _post(wallet, 50, t0 + timedelta(hours=1), "adj_bo2")
    staff = staff_login_ensure(username="fin-at", password="pw-at-12345", role="finance")
    staff.user.user_permissions.add(*Permission.objects.filter(content_type__app_label="wallets", codename__in=["view_account", "view_customer"]))
    client = Client(HTTP_HOST=TENANT_A["domain"])
    assert client.login(username="fin-at", password="pw-at-12345")
    url = reverse("admin:wallets_account_balance_at", args=[wallet.pk])
    customer_page = client.get(reverse("admin:wallets_customer_change", args=[world.customer.id]))
    assert customer_page.status_code == 200 and url.encode() in customer_page.content
    for at, shown in ((t0.strftime("%Y-%m-%dT%H:%M:%S"), b"700"), ((t0 + timedelta(hours=1)).isoformat(), b"750")):
        page = client.get(url, {"at": at})
        assert page.status_code == 200 and b'id="balance-at-result"' in page.content and shown in page.content, page.content
    for bad, says in (("2999-01-01T00:00", b"in the future"), ("next tuesday", b"is not a date and time")):
        page = client.get(url, {"at": bad})
        assert page.status_code == 200 and b'id="balance-at-error"' in page.content and says in page.content
    assert client.get(reverse("admin:wallets_account_balance_at", args=["acc_nope"])).status_code == 404
