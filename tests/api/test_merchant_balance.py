"""`GET /v1/merchant/balance`: balance, held, and their split into available and pending by
the settlement delay, the split payout creation uses too (a canceled payout's money is
available at once to both); and the delay's settings in the back office and the platform admin."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from devtools.demo_seed import staff_login_ensure
from payments.models import MerchantBankAccount, Payout
from payments.services.payouts import bank_account_attach, payout_cancel
from tenants.middleware import tenant_cache_clear
from tenants.models import Tenant
from tests.api.conftest import Api, World
from tests.api.test_money_endpoints import fund, pay
from tests.conftest import TENANT_A
from tests.payouts_support import fund as fund_days_ago
from wallets.daily_totals import MIGRATION as DAILY_TOTALS
from wallets.models import Account, AuditEntry, Merchant, StagedMigrationState, StagedPhase, SystemRole
from wallets.services.ledger import Leg, ledger_post
from wallets.services.principals import merchant_settlement_delay_set
from wallets.staged.phases import staged_phase_forget


def _jpy(api: Api, key: str) -> dict[str, Any]:
    r = api.get("/v1/merchant/balance", key)
    assert r.status_code == 200, r.content
    return next(line for line in r.json()["balances"] if line["asset"] == "JPY")  # type: ignore[no-any-return]


def test_the_balance_splits_into_available_and_pending(api: Api, world: World, tenant: Tenant) -> None:
    fund(world, world.customer.obj, 5000)
    account = Account.objects.get(merchant_id=world.merchant.id)
    source = Account.objects.get(system_role=SystemRole.ADJUSTMENTS)
    long_ago = timezone.now() - timedelta(days=3)  # older than the tenant's default 2 days
    ledger_post(kind="adjustment", reference="adj_old", legs=[Leg(account, "JPY", 300), Leg(source, "JPY", -300)], created=long_ago)
    paid = pay(api, world, 1200)
    assert _jpy(api, world.merchant.key) == {"asset": "JPY", "balance": 1500, "available": 300, "pending": 1200, "held": 0}
    # A refund draws on available first, then pending.
    assert api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid["id"], "amount": 400}).status_code == 201
    assert _jpy(api, world.merchant.key) == {"asset": "JPY", "balance": 1100, "available": 0, "pending": 1100, "held": 0}
    merchant_settlement_delay_set(merchant=world.merchant.obj, days=0)  # the merchant's override: no delay
    assert _jpy(api, world.merchant.key) == {"asset": "JPY", "balance": 1100, "available": 1100, "pending": 0, "held": 0}
    body = api.get("/v1/merchant/balance", world.merchant2.key).json()
    assert body["merchant"] == world.merchant2.id and body["object"] == "balance"
    assert all(set(line) == {"asset", "balance", "available", "pending", "held"} and line["balance"] == 0 for line in body["balances"])
    merchant_settlement_delay_set(merchant=world.merchant.obj, days=None)
    try:
        Tenant.objects.filter(pk=tenant.pk).update(settlement_delay_days=0)
        tenant_cache_clear()
        assert _jpy(api, world.merchant.key)["available"] == 1100  # the tenant's setting, once the override is gone
    finally:
        tenant_cache_clear()  # the host cache holds the row this test changed (rolled back after it)


@pytest.mark.parametrize("phase", [StagedPhase.VERIFIED, StagedPhase.READS_SWITCHED])
def test_a_canceled_payout_s_money_is_available_at_once_to_the_balance_and_to_a_new_payout(
    api: Api, world: World, tenant: Tenant, phase: StagedPhase
) -> None:
    """The balance and payout creation split by one selector: the money of a payout that
    came back is available at once on both, never pending on one and available on the other.
    Daily totals written in both phases; read from the ledger's window (`verified`), then
    from the totals (`reads_switched`), which alone cannot tell a credit's kind."""
    StagedMigrationState.objects.update_or_create(name=DAILY_TOTALS, defaults={"phase": phase})
    staged_phase_forget()
    try:
        merchant, key = world.merchant.obj, world.merchant.key
        fund_days_ago(merchant, 5_000, days_ago=3)
        fund_days_ago(merchant, 2_000, days_ago=0)
        bank_account_attach(merchant=merchant, token="btok_bank", staff=world.staff.obj)
        MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=8))
        made = api.post("/v1/merchant/payouts", key, {"asset": "JPY", "amount": 5_000})
        assert made.status_code == 201, made.content
        assert _jpy(api, key) == {"asset": "JPY", "balance": 2_000, "available": 0, "pending": 2_000, "held": 0}
        payout_cancel(payout=Payout.objects.get(pk=made.json()["id"]), reason="the merchant asked")  # never sent: money back today
        assert _jpy(api, key) == {"asset": "JPY", "balance": 7_000, "available": 5_000, "pending": 2_000, "held": 0}
        over = api.post("/v1/merchant/payouts", key, {"asset": "JPY", "amount": 5_001})
        assert over.status_code == 402 and over.json()["error"]["code"] == "insufficient_available", over.content
        assert api.post("/v1/merchant/payouts", key, {"asset": "JPY", "amount": 5_000}).status_code == 201
        assert _jpy(api, key) == {"asset": "JPY", "balance": 2_000, "available": 0, "pending": 2_000, "held": 0}
    finally:
        staged_phase_forget()


def test_the_schema_documents_pending(world: World) -> None:
    doc = yaml.safe_load(Client(HTTP_HOST=world.host).get("/v1/schema").content)
    line = doc["components"]["schemas"]["MerchantBalanceLineOut"]
    assert set(line["required"]) >= {"asset", "balance", "available", "pending", "held"}
    assert "settlement delay" in line["properties"]["pending"]["description"]


def _confirm_key(page: Any) -> str:
    match = re.search(rb'name="idempotency_key" value="([0-9a-f]+)"', page.content)
    assert match, page.content[:2000]
    return match.group(1).decode()


def test_finance_sets_a_merchant_s_delay_in_the_back_office_audited(world: World, tenant: Tenant) -> None:
    merchant_id = world.merchant.id
    page_url, url = f"/admin/wallets/merchant/{quote(merchant_id)}/change/", f"/admin/wallets/merchant/{quote(merchant_id)}/act/settlement_delay/"
    fin = staff_login_ensure(username="fin-delay", password="pw-delay-123", role="finance")
    ops = staff_login_ensure(username="ops-delay", password="pw-delay-123", role="operator")
    # Its own permission: finance may set the delay, not change a merchant otherwise; Django's
    # generic change permission does not open the action.
    assert fin.user.has_perm("wallets.set_settlement_delay") and not fin.user.has_perm("wallets.change_merchant")
    ops.user.user_permissions.add(Permission.objects.get(content_type__app_label="wallets", codename="change_merchant"))
    finance, operator = Client(HTTP_HOST=TENANT_A["domain"]), Client(HTTP_HOST=TENANT_A["domain"])
    assert finance.login(username="fin-delay", password="pw-delay-123") and operator.login(username="ops-delay", password="pw-delay-123")
    page = finance.get(page_url)
    assert page.status_code == 200 and b"2 days (the tenant&#x27;s)" in page.content and b"act/settlement_delay" in page.content
    assert operator.get(url).status_code == 403
    refused = finance.post(url, {"idempotency_key": _confirm_key(finance.get(url)), "settlement_delay_days": 61})
    assert refused.status_code == 200 and Merchant.objects.get(pk=merchant_id).settlement_delay_days is None
    done = finance.post(url, {"idempotency_key": _confirm_key(finance.get(url)), "settlement_delay_days": 7, "reason": "new merchant"})
    assert done.status_code == 302 and Merchant.objects.get(pk=merchant_id).settlement_delay_days == 7
    entry = AuditEntry.objects.get(action="admin.settlement_delay", target_id=merchant_id)
    assert (entry.actor, entry.before["settlement_delay_days"], entry.after["settlement_delay_days"]) == ("user:fin-delay", None, 7)
    assert b"7 days" in finance.get(page_url).content
