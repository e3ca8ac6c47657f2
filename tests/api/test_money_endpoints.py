"""Customer, terminal and merchant money endpoints through HTTP, one test per endpoint
(or per small family), on real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from payments.models import Payment, Refund, TopUp, Transfer
from payments.services.adjustments import adjustment_create
from tests.api.conftest import Api, World, error_of
from wallets.models import Account


def fund(world: World, party: object, amount: int, asset: str = "JPY") -> None:
    adjustment_create(staff=world.staff.obj, customer=party, asset_code=asset, amount=amount, direction="credit", reason="test funding")


def balance_of(api: Api, key: str, asset: str = "JPY") -> dict:  # type: ignore[type-arg]
    lines = api.get("/v1/customer/wallet", key).json()["balances"]
    return next(line for line in lines if line["asset"] == asset)  # type: ignore[no-any-return]


def pay(api: Api, world: World, amount: int = 1000, **body: object) -> dict:  # type: ignore[type-arg]
    payload = {"customer": world.customer.id, "asset": "JPY", "amount": amount, **body}
    r = api.post("/v1/terminal/payments", world.terminal.key, payload)
    assert r.status_code == 201, r.content
    return r.json()  # type: ignore[no-any-return]


# --- customer ------------------------------------------------------------------------


def test_wallet_shows_every_asset_with_available_and_held(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 5000)
    r = api.get("/v1/customer/wallet", world.customer.key)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "wallet" and body["customer"] == world.customer.id and body["frozen"] is False
    assert {line["asset"] for line in body["balances"]} == {"JPY", "POINT", "CARBON"}
    assert balance_of(api, world.customer.key) == {"asset": "JPY", "balance": 5000, "available": 5000, "held": 0}


def test_transactions_paginate_and_filter(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 5000)
    for _ in range(3):
        pay(api, world, 100)
    r = api.get("/v1/customer/transactions", world.customer.key, {"asset": "JPY", "limit": 2})
    assert r.status_code == 200
    page1 = r.json()
    assert page1["object"] == "list" and len(page1["data"]) == 2 and page1["next_cursor"]
    assert all(t["asset"] == "JPY" and t["object"] == "transaction" for t in page1["data"])
    page2 = api.get("/v1/customer/transactions", world.customer.key, {"asset": "JPY", "limit": 2, "cursor": page1["next_cursor"]}).json()
    assert page2["next_cursor"] is None
    # every entry exactly once across pages (inside one test transaction the SQL hot path and
    # Python stamp `created` differently, so only the set is asserted, not the order)
    lines = page1["data"] + page2["data"]
    assert sorted(t["amount"] for t in lines) == [-100, -100, -100, 5000]
    assert {t["type"] for t in lines} == {"payment", "adjustment"}
    future = (timezone.now() + timedelta(days=1)).isoformat()
    assert api.get("/v1/customer/transactions", world.customer.key, {"created_gte": future}).json()["data"] == []
    bad = api.get("/v1/customer/transactions", world.customer.key, {"cursor": "not-a-cursor"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "cursor"
    bad = api.get("/v1/customer/transactions", world.customer.key, {"limit": "ten"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "limit"
    # page size is capped, not refused
    assert api.get("/v1/customer/transactions", world.customer.key, {"limit": 5000}).status_code == 200


def test_payment_token_pays_at_the_terminal(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 3000)
    r = api.post("/v1/customer/payment_tokens", world.customer.key)
    assert r.status_code == 201, r.content
    token = r.json()
    assert token["token"] and token["expires_at"]
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": token["token"], "asset": "JPY", "amount": 1200})
    assert r.status_code == 201, r.content
    payment = r.json()
    assert payment["customer"] == world.customer.id and payment["merchant"] == world.merchant.id
    assert payment["store"] == world.store.pk and payment["terminal"] == world.terminal.id and payment["status"] == "succeeded"
    assert balance_of(api, world.customer.key)["balance"] == 1800
    bad = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": "ptok_unknown12345", "asset": "JPY", "amount": 1})
    assert bad.status_code == 404 and error_of(bad)["param"] == "customer_token"


def test_transfer(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    r = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": world.customer2.id, "asset": "JPY", "amount": 400})
    assert r.status_code == 201, r.content
    t = r.json()
    assert t["id"].startswith("trf_") and t["object"] == "transfer" and t["amount"] == 400
    assert balance_of(api, world.customer2.key)["balance"] == 400
    assert api.get(f"/v1/customer/transfers/{t['id']}", world.customer2.key).status_code == 200  # the receiver sees it
    assert [x["id"] for x in api.get("/v1/customer/transfers", world.customer.key).json()["data"]] == [t["id"]]
    r = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": world.customer2.id, "asset": "JPY", "amount": 601})
    assert r.status_code == 402 and error_of(r)["code"] == "insufficient_funds"
    r = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": world.customer.id, "asset": "JPY", "amount": 1})
    assert r.status_code == 400 and error_of(r)["param"] == "to_customer"
    r = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": "cus_nobody", "asset": "JPY", "amount": 1})
    assert r.status_code == 404 and error_of(r)["param"] == "to_customer"


def test_topup_charges_the_card_and_credits_the_wallet(api: Api, world: World) -> None:
    r = api.post("/v1/customer/topups", world.customer.key, {"asset": "JPY", "amount": 5000, "payment_method": "pm_card_visa"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "succeeded" and body["id"].startswith("top_") and body["amount"] == 5000
    assert TopUp.objects.filter(pk=body["id"], customer=world.customer.obj).exists()
    assert api.get(f"/v1/customer/topups/{body['id']}", world.customer.key).json()["status"] == "succeeded"
    assert api.get("/v1/customer/topups", world.customer.key).json()["data"][0]["id"] == body["id"]
    assert balance_of(api, world.customer.key)["balance"] == 5000


def test_customer_sees_own_payments_and_refunds(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    p = pay(api, world, 500)
    refund = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": p["id"], "amount": 200}).json()
    assert [x["id"] for x in api.get("/v1/customer/payments", world.customer.key).json()["data"]] == [p["id"]]
    assert api.get(f"/v1/customer/payments/{p['id']}", world.customer.key).json()["amount_refunded"] == 200
    assert [x["id"] for x in api.get("/v1/customer/refunds", world.customer.key).json()["data"]] == [refund["id"]]
    assert api.get(f"/v1/customer/refunds/{refund['id']}", world.customer.key).status_code == 200
    assert api.get(f"/v1/customer/payments/{p['id']}", world.customer2.key).status_code == 404
    assert api.get(f"/v1/customer/refunds/{refund['id']}", world.customer2.key).status_code == 404
    assert api.get("/v1/customer/payments", world.customer2.key).json()["data"] == []


# --- terminal ------------------------------------------------------------------------


def test_terminal_payment_lookup_is_store_scoped(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    p = pay(api, world, 300)
    assert api.get(f"/v1/terminal/payments/{p['id']}", world.terminal.key).json()["amount"] == 300
    assert [x["id"] for x in api.get("/v1/terminal/payments", world.terminal.key).json()["data"]] == [p["id"]]
    # same merchant, other store; other merchant: 404, and no amount leaks
    for other in (world.terminal_same_merchant_other_store, world.terminal2):
        r = api.get(f"/v1/terminal/payments/{p['id']}", other.key)
        assert r.status_code == 404 and "300" not in r.content.decode()


def test_terminal_refunds_same_day_only(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    p = pay(api, world, 600)
    r = api.post("/v1/terminal/refunds", world.terminal.key, {"payment": p["id"], "amount": 100, "reason": "wrong item"})
    assert r.status_code == 201, r.content
    assert r.json()["payment"] == p["id"] and r.json()["amount"] == 100 and r.json()["reason"] == "wrong item"
    assert api.post("/v1/terminal/refunds", world.terminal2.key, {"payment": p["id"], "amount": 1}).status_code == 404
    Payment.objects.filter(pk=p["id"]).update(created=timezone.now() - timedelta(days=2))
    r = api.post("/v1/terminal/refunds", world.terminal.key, {"payment": p["id"], "amount": 100})
    assert r.status_code == 409 and error_of(r)["code"] == "refund_window_closed"
    assert Refund.objects.filter(payment_id=p["id"]).count() == 1


# --- merchant ------------------------------------------------------------------------


def test_merchant_refunds_partial_repeated_bounded(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    p = pay(api, world, 1000)
    for amount in (300, 300):
        r = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": p["id"], "amount": amount})
        assert r.status_code == 201, r.content
    r = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": p["id"], "amount": 401})
    assert r.status_code == 400 and error_of(r)["param"] == "amount"
    assert api.post("/v1/merchant/refunds", world.merchant.key, {"payment": p["id"], "amount": 400}).status_code == 201
    assert api.get(f"/v1/merchant/payments/{p['id']}", world.merchant.key).json()["amount_refunded"] == 1000
    refunds = api.get("/v1/merchant/refunds", world.merchant.key).json()["data"]
    assert len(refunds) == 3
    assert api.get(f"/v1/merchant/refunds/{refunds[0]['id']}", world.merchant.key).status_code == 200
    assert api.get(f"/v1/merchant/refunds/{refunds[0]['id']}", world.merchant2.key).status_code == 404
    assert api.post("/v1/merchant/refunds", world.merchant2.key, {"payment": p["id"], "amount": 1}).status_code == 404
    assert balance_of(api, world.customer.key)["balance"] == 1000


def test_merchant_payments_and_balance(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    p = pay(api, world, 700)
    listed = api.get("/v1/merchant/payments", world.merchant.key, {"asset": "JPY"}).json()["data"]
    assert [x["id"] for x in listed] == [p["id"]]
    assert api.get("/v1/merchant/payments", world.merchant2.key).json()["data"] == []
    bal = api.get("/v1/merchant/balance", world.merchant.key).json()
    assert bal["merchant"] == world.merchant.id
    assert next(b for b in bal["balances"] if b["asset"] == "JPY")["balance"] == 700


def test_merchant_stores_and_terminals(api: Api, world: World) -> None:
    stores = api.get("/v1/merchant/stores", world.merchant.key).json()["data"]
    assert world.store.pk in {x["id"] for x in stores} and world.store2.pk not in {x["id"] for x in stores}
    assert api.get(f"/v1/merchant/stores/{world.store2.pk}", world.merchant.key).status_code == 404
    terminals = api.get("/v1/merchant/terminals", world.merchant.key).json()["data"]
    assert {x["id"] for x in terminals} == {world.terminal.id, world.terminal_same_merchant_other_store.id}
    assert api.get(f"/v1/merchant/terminals/{world.terminal.id}", world.merchant.key).status_code == 200
    assert api.get(f"/v1/merchant/terminals/{world.terminal2.id}", world.merchant.key).status_code == 404


def test_payment_intent_automatic(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    r = api.post("/v1/merchant/payment_intents", world.merchant.key, {"customer": world.customer.id, "asset": "JPY", "amount": 100})
    assert r.status_code == 201, r.content
    pi = r.json()
    assert pi["status"] == "created" and pi["capture_method"] == "automatic"
    r = api.post(f"/v1/merchant/payment_intents/{pi['id']}", world.merchant.key, {"amount": 250})
    assert r.status_code == 200 and r.json()["amount"] == 250
    r = api.post(f"/v1/merchant/payment_intents/{pi['id']}/confirm", world.merchant.key, {})
    assert r.status_code == 200 and r.json()["status"] == "charged" and r.json()["payment"]
    r = api.post(f"/v1/merchant/payment_intents/{pi['id']}", world.merchant.key, {"amount": 300})
    assert r.status_code == 409 and error_of(r)["code"] == "invalid_state"
    assert balance_of(api, world.customer.key)["balance"] == 750
    assert api.get(f"/v1/merchant/payment_intents/{pi['id']}", world.merchant.key).json()["status"] == "charged"
    assert api.get("/v1/merchant/payment_intents", world.merchant.key).json()["data"][0]["id"] == pi["id"]
    assert api.get(f"/v1/merchant/payment_intents/{pi['id']}", world.merchant2.key).status_code == 404


def test_payment_intent_manual_capture_and_cancel(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    body = {"customer": world.customer.id, "asset": "JPY", "amount": 600, "capture_method": "manual"}
    pi = api.post("/v1/merchant/payment_intents", world.merchant.key, body).json()
    r = api.post(f"/v1/merchant/payment_intents/{pi['id']}/authorize", world.merchant.key, {})
    assert r.status_code == 200 and r.json()["status"] == "authorized"
    assert balance_of(api, world.customer.key) == {"asset": "JPY", "balance": 1000, "available": 400, "held": 600}
    r = api.post(f"/v1/merchant/payment_intents/{pi['id']}/capture", world.merchant.key, {"amount_to_capture": 500})
    assert r.status_code == 200 and r.json()["status"] == "captured" and r.json()["amount_captured"] == 500
    assert balance_of(api, world.customer.key) == {"asset": "JPY", "balance": 500, "available": 500, "held": 0}
    pi2 = api.post("/v1/merchant/payment_intents", world.merchant.key, body | {"amount": 100}).json()
    assert api.post(f"/v1/merchant/payment_intents/{pi2['id']}/confirm", world.merchant.key, {}).json()["status"] == "authorized"
    r = api.post(f"/v1/merchant/payment_intents/{pi2['id']}/cancel", world.merchant.key, {})
    assert r.status_code == 200 and r.json()["status"] == "canceled"
    assert balance_of(api, world.customer.key)["held"] == 0


# --- admin money ---------------------------------------------------------------------


def test_adjustments(api: Api, world: World) -> None:
    body = {"customer": world.customer.id, "asset": "POINT", "amount": 50, "direction": "credit", "reason": "goodwill"}
    r = api.post("/v1/admin/adjustments", world.staff.key, body)
    assert r.status_code == 201, r.content
    adj = r.json()
    assert adj["id"].startswith("adj_") and adj["staff"] == world.staff.id and adj["customer"] == world.customer.id
    assert balance_of(api, world.customer.key, "POINT")["balance"] == 50
    assert api.get(f"/v1/admin/adjustments/{adj['id']}", world.staff.key).status_code == 200
    assert api.get("/v1/admin/adjustments", world.staff.key).json()["data"][0]["id"] == adj["id"]
    r = api.post("/v1/admin/adjustments", world.staff.key, body | {"direction": "debit", "amount": 51})
    assert r.status_code == 402
    r = api.post("/v1/admin/adjustments", world.staff.key, body | {"merchant": world.merchant.id})
    assert r.status_code == 400 and error_of(r)["param"] == "customer"
    r = api.post("/v1/admin/adjustments", world.staff.key, {k: v for k, v in body.items() if k != "reason"})
    assert r.status_code == 400 and error_of(r)["param"] == "reason" and error_of(r)["code"] == "parameter_missing"


def test_freeze_and_unfreeze(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    r = api.post(f"/v1/admin/customers/{world.customer.id}/freeze", world.staff.key, {"reason": "fraud review"})
    assert r.status_code == 200 and r.json()["frozen"] is True
    assert Account.objects.get(customer=world.customer.obj).frozen
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1})
    assert r.status_code == 402 and error_of(r)["code"] == "wallet_frozen"
    assert api.get("/v1/customer/wallet", world.customer.key).json()["frozen"] is True
    r = api.post(f"/v1/admin/customers/{world.customer.id}/unfreeze", world.staff.key, {})
    assert r.status_code == 200 and r.json()["frozen"] is False
    pay(api, world, 1)
    assert api.post("/v1/admin/customers/cus_nobody/freeze", world.staff.key, {"reason": "x"}).status_code == 404


@pytest.mark.parametrize("model", [Transfer])
def test_no_rows_without_funds(api: Api, world: World, model: type) -> None:
    r = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": world.customer2.id, "asset": "JPY", "amount": 1})
    assert r.status_code == 402
    assert not model.objects.exists()


def test_payment_token_pays_once_and_a_refused_payment_does_not_use_it(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 1000)
    token = api.post("/v1/customer/payment_tokens", world.customer.key).json()["token"]
    refused = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": token, "asset": "JPY", "amount": 5000})
    assert refused.status_code == 402, refused.content  # nothing moved: the token is still good
    paid = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": token, "asset": "JPY", "amount": 300})
    assert paid.status_code == 201, paid.content
    again = api.post("/v1/terminal/payments", world.terminal.key, {"customer_token": token, "asset": "JPY", "amount": 300})
    assert again.status_code == 404 and error_of(again)["param"] == "customer_token"
    assert balance_of(api, world.customer.key)["balance"] == 700
