"""The merchant's payouts over HTTP: POST /v1/merchant/payouts pays out available funds (the
201 replays under its key), GET lists and retrieves the merchant's own; each bad input is a
4xx with its own code and moves nothing (over available, an asset not payable, no bank
account, held, frozen, a malformed amount); two concurrent payouts of the whole balance
(real threads, real PostgreSQL): one 201, the other 402. And the back office's payout
pages, queues and actions."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from payments.models import MerchantBankAccount, Payout
from payments.services.payouts import bank_account_attach, merchant_payouts_hold
from tests.api.conftest import Api, World, error_of
from tests.api.test_backoffice import _confirm_key, _login, q
from tests.conftest import run_in_thread_tenant
from tests.payouts_support import PAYOUTS_TENANT, balance, fund
from wallets.models import Account, Balance
from wallets.services.principals import api_key_create

URL = "/v1/merchant/payouts"


@pytest.fixture
def payee(world: World) -> World:
    """The world's merchant with 5,000 JPY available, 2,000 pending, and a bank account."""
    fund(world.merchant.obj, 5_000, days_ago=3)
    fund(world.merchant.obj, 2_000, days_ago=0)
    bank_account_attach(merchant=world.merchant.obj, token="btok_bank", staff=world.staff.obj)
    MerchantBankAccount.objects.filter(merchant=world.merchant.obj).update(changed_at=timezone.now() - timedelta(days=8))
    return world


def test_a_payout_of_available_funds_is_made_replayed_and_listed(api: Api, payee: World) -> None:
    key = payee.merchant.key
    idem = uuid.uuid4().hex
    r = api.post(URL, key, {"asset": "JPY", "amount": 5_000}, idem=idem)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["object"] == "payout" and body["id"].startswith("po_") and body["status"] == "pending"
    assert (body["amount"], body["asset"], body["merchant"], body["bank_account_last4"], body["origin"]) == (
        5_000, "JPY", payee.merchant.id, "6789", "manual")
    assert body["awaiting_approval"] is False and body["failure_code"] == ""
    again = api.post(URL, key, {"asset": "JPY", "amount": 5_000}, idem=idem)
    assert again.status_code == 201 and again.content == r.content and again["Idempotent-Replayed"] == "true"
    assert Payout.objects.filter(merchant=payee.merchant.obj).count() == 1 and balance(payee.merchant.obj) == 2_000
    assert [p["id"] for p in api.get(URL, key).json()["data"]] == [body["id"]]
    assert api.get(f"{URL}/{body['id']}", key).json()["id"] == body["id"]
    assert api.get(URL, key, {"status": "paid"}).json()["data"] == []
    other = api.get(f"{URL}/{body['id']}", payee.merchant2.key)
    assert other.status_code == 404 and api.get(URL, payee.merchant2.key).json()["data"] == []


def test_pending_funds_are_not_available(api: Api, payee: World) -> None:
    r = api.post(URL, payee.merchant.key, {"asset": "JPY", "amount": 5_001})  # 7,000 in all, 2,000 of it credited today
    assert r.status_code == 402 and error_of(r)["code"] == "insufficient_available" and error_of(r)["param"] == "amount"
    assert not Payout.objects.filter(merchant=payee.merchant.obj).exists() and balance(payee.merchant.obj) == 7_000


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [("not_payable", 409, "asset_not_payable"), ("no_bank_account", 409, "bank_account_missing"), ("held", 403, "payouts_held"),
     ("frozen", 402, "wallet_frozen"), ("unknown_asset", 400, "asset_unknown")],
)
def test_each_refusal_has_its_own_code_and_moves_nothing(api: Api, payee: World, case: str, status: int, code: str) -> None:
    merchant = payee.merchant.obj
    body: dict[str, Any] = {"asset": "JPY", "amount": 100}
    if case == "not_payable":
        body["asset"] = "POINT"
    elif case == "unknown_asset":
        body["asset"] = "XTS"
    elif case == "no_bank_account":
        MerchantBankAccount.objects.filter(merchant=merchant).delete()
    elif case == "held":
        merchant_payouts_hold(merchant=merchant, held=True, reason="review")
    else:  # frozen as a freeze does it: the account and its balance rows
        Account.objects.filter(merchant=merchant).update(frozen=True, frozen_reason="review")
        Balance.objects.filter(account__merchant=merchant).update(frozen=True)
    r = api.post(URL, payee.merchant.key, body)
    assert r.status_code == status and error_of(r)["code"] == code, r.content
    assert not Payout.objects.filter(merchant=merchant).exists() and balance(merchant) == 7_000


@pytest.mark.parametrize("amount", [0, -5, 1.5, "100", None, True, 10**20])
def test_a_malformed_amount_is_a_400(api: Api, payee: World, amount: Any) -> None:
    r = api.post(URL, payee.merchant.key, {"asset": "JPY", "amount": amount})
    assert r.status_code == 400, (amount, r.content)
    assert error_of(r)["param"] == "amount"
    assert not Payout.objects.filter(merchant=payee.merchant.obj).exists()


def test_unknown_fields_and_other_faces_are_refused(api: Api, payee: World) -> None:
    r = api.post(URL, payee.merchant.key, {"asset": "JPY", "amount": 100, "destination": "ba_x"})
    assert r.status_code == 400
    assert api.post(URL, payee.customer.key, {"asset": "JPY", "amount": 100}).status_code == 403
    assert not Payout.objects.filter(merchant=payee.merchant.obj).exists()


def test_two_concurrent_payouts_of_the_whole_balance_one_succeeds_one_is_402(payouts_world: Any) -> None:
    from tenants.models import Tenant

    tenant = Tenant.objects.get(schema_name=PAYOUTS_TENANT["schema_name"])
    merchant = payouts_world.merchant(funds=6_000)
    key = api_key_create(principal=merchant)[1]
    barrier = threading.Barrier(2)
    answers: list[Any] = []

    def pay() -> None:
        client = Client(HTTP_HOST=PAYOUTS_TENANT["domain"])
        barrier.wait()
        answers.append(client.post(URL, data='{"asset": "JPY", "amount": 6000}', content_type="application/json",
                                   HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex))

    threads = [threading.Thread(target=run_in_thread_tenant, args=(tenant, pay)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(a.status_code for a in answers) == [201, 402]
    assert [a.json()["error"]["code"] for a in answers if a.status_code == 402] == ["insufficient_available"]
    assert Payout.objects.filter(merchant=merchant).count() == 1 and balance(merchant) == 0


# --- Back office ---------------------------------------------------------------------------------------


def test_the_back_office_shows_payouts_with_their_ledger_and_psp_reference_and_acts_on_them(api: Api, world: World) -> None:
    merchant = world.merchant.obj
    fund(merchant, 9_000, days_ago=3)
    client = _login(f"po-root-{uuid.uuid4().hex[:6]}", superuser=True)
    page = client.get(f"/admin/wallets/merchant/{q(merchant.pk)}/act/bank_account/")
    assert client.post(f"/admin/wallets/merchant/{q(merchant.pk)}/act/bank_account/",
                       {"idempotency_key": _confirm_key(page), "token": "btok_bank"}).status_code == 302
    assert MerchantBankAccount.objects.get(merchant=merchant).last4 == "6789"
    made = api.post("/v1/merchant/payouts", world.merchant.key, {"asset": "JPY", "amount": 4_000}).json()
    assert made["awaiting_approval"] is True  # the account was attached just now
    for query in ("", "?queue=approval", "?queue=overdue", "?queue=unsent", "?status=pending"):
        assert client.get(f"/admin/payments/payout/{query}").status_code == 200, query
    assert made["id"] in client.get("/admin/payments/payout/?queue=approval").content.decode()
    detail = client.get(f"/admin/payments/payout/{q(made['id'])}/change/").content.decode()
    payout = Payout.objects.get(pk=made["id"])
    assert f"/admin/wallets/ledgertransaction/{q(payout.ledger_transaction_id)}/change/" in detail and "6789" in detail
    assert "/act/approve/" in detail and "/act/cancel/" in detail
    page = client.get(f"/admin/payments/payout/{q(made['id'])}/act/cancel/")
    assert client.post(f"/admin/payments/payout/{q(made['id'])}/act/cancel/",
                       {"idempotency_key": _confirm_key(page), "reason": "asked"}).status_code == 302
    canceled = Payout.objects.get(pk=made["id"])
    assert canceled.status == "canceled" and balance(merchant) == 9_000
    assert f"/admin/wallets/ledgertransaction/{q(str(canceled.returned_transaction_id))}/change/" in client.get(
        f"/admin/payments/payout/{q(made['id'])}/change/").content.decode()
    page = client.get(f"/admin/wallets/merchant/{q(merchant.pk)}/act/hold_payouts/")
    assert client.post(f"/admin/wallets/merchant/{q(merchant.pk)}/act/hold_payouts/",
                       {"idempotency_key": _confirm_key(page), "reason": "review"}).status_code == 302
    merchant.refresh_from_db()
    assert merchant.payouts_held and "held since" in client.get(f"/admin/wallets/merchant/{q(merchant.pk)}/change/").content.decode()


def test_a_viewer_cannot_act_on_payouts(api: Api, world: World) -> None:
    viewer = _login(f"po-viewer-{uuid.uuid4().hex[:6]}", role="viewer")
    assert viewer.get(f"/admin/wallets/merchant/{q(world.merchant.id)}/act/hold_payouts/").status_code == 403
    assert viewer.get(f"/admin/wallets/merchant/{q(world.merchant.id)}/act/bank_account/").status_code == 403
    assert viewer.get("/admin/payments/payout/").status_code == 200


def test_the_back_office_operator_queue_stops_a_payout_and_two_staff_members_fail_it(api: Api, payee: World, psp_simulator: Any) -> None:
    from payments.services.payout_saga import payout_return, payout_submit

    made = api.post(URL, payee.merchant.key, {"asset": "JPY", "amount": 3_000}).json()
    psp_simulator.faults(fail_5xx=1)
    try:
        assert payout_submit(payout_id=made["id"]) == "unavailable"  # the PSP never heard of it
    finally:
        psp_simulator.faults(fail_5xx=0)
    Payout.objects.filter(pk=made["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    root = _login(f"po-root-{uuid.uuid4().hex[:6]}", superuser=True)
    change = f"/admin/payments/payout/{q(made['id'])}/change/"
    assert "/act/stop/" in root.get(change).content.decode()
    page = root.get(f"/admin/payments/payout/{q(made['id'])}/act/stop/")
    assert root.post(f"/admin/payments/payout/{q(made['id'])}/act/stop/",
                     {"idempotency_key": _confirm_key(page), "reason": "stuck for days"}).status_code == 302
    assert made["id"] in root.get("/admin/payments/payout/?queue=review").content.decode()
    detail = root.get(change).content.decode()
    assert "holds no payout" in detail and "/act/resolve_failed/" in detail and "/act/stop/" not in detail

    finance = _login(f"po-fin-{uuid.uuid4().hex[:6]}", role="finance")
    for client, proposed in ((finance, True), (root, False)):
        page = client.get(f"/admin/payments/payout/{q(made['id'])}/act/resolve_failed/")
        assert client.post(f"/admin/payments/payout/{q(made['id'])}/act/resolve_failed/",
                           {"idempotency_key": _confirm_key(page), "reason": "nothing at the PSP"}).status_code == 302
        assert (Payout.objects.get(pk=made["id"]).review_at is not None) is proposed
    # Confirmed: the PSP may have it (it was asked), so its money is owed back through the PSP, asked after the
    # confirmation's commit (which this test's transaction never makes: asked here).
    owed = Payout.objects.get(pk=made["id"])
    assert owed.status == "pending" and owed.return_owed_at is not None and balance(payee.merchant.obj) == 2_000 + 2_000
    assert payout_return(payout_id=made["id"]) == "failed"  # the PSP holds nothing of it: nothing to take back
    failed = Payout.objects.get(pk=made["id"])
    assert failed.status == "failed" and balance(payee.merchant.obj) == 5_000 + 2_000
    assert made["id"] not in root.get("/admin/payments/payout/?queue=review").content.decode()
    viewer = _login(f"po-view-{uuid.uuid4().hex[:6]}", role="viewer")
    assert viewer.get(f"/admin/payments/payout/{q(made['id'])}/act/stop/").status_code == 403
