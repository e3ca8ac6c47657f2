"""Every endpoint x every principal: no key and bad keys get 401, other principal types 403,
a key of the other tenant 401 (keys live in their tenant's schema), and a principal of the
same type that does not own the object 404 -- with nothing of the object in any body."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.urls import URLResolver, get_resolver

from payments.models import OutboxEvent
from payments.services.adjustments import adjustment_create
from payments.services.fees import fee_schedule_create
from tests.api.conftest import Api, World, error_of
from wallets.services.principals import api_key_create, customer_create

FACE_OF_TYPE = {"customer": "customer", "terminal": "terminal", "merchant": "merchant", "staff": "admin"}


@dataclass
class Objects:
    ids: dict[str, str]
    secrets: list[str]


@pytest.fixture
def objects(api: Api, world: World) -> Objects:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    payment = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 4321}).json()
    refund = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": payment["id"], "amount": 21}).json()
    bystander = customer_create(name="Bystander")  # receives the transfer, so customer2 stays unrelated
    transfer = api.post("/v1/customer/transfers", world.customer.key, {"to_customer": bystander.pk, "asset": "JPY", "amount": 77}).json()
    topup = api.post("/v1/customer/topups", world.customer.key, {"asset": "JPY", "amount": 555, "payment_method": "pm_card_visa"}).json()
    intent = api.post("/v1/merchant/payment_intents", world.merchant.key, {"customer": world.customer.id, "asset": "JPY", "amount": 99}).json()
    hook = api.post("/v1/merchant/webhook_endpoints", world.merchant.key, {"url": "https://93.184.215.14/h", "enabled_events": ["*"]}).json()
    mandate = api.post("/v1/customer/mandates", world.customer.key, {"merchant": world.merchant.id}).json()
    adj = api.post("/v1/admin/adjustments", world.staff.key,
                   {"customer": world.customer.id, "asset": "POINT", "amount": 5, "direction": "credit", "reason": "x"}).json()
    held = api.post("/v1/admin/adjustments", world.staff.key,
                    {"customer": world.customer.id, "asset": "POINT", "amount": 10**6, "direction": "credit", "reason": "y"}).json()
    payout = _payout(api, world)
    ids = {
        "payout_id": payout["id"],
        "pending_adjustment_id": held["id"],
        "payment_id": payment["id"], "refund_id": refund["id"], "transfer_id": transfer["id"], "topup_id": topup["id"],
        "intent_id": intent["id"], "endpoint_id": hook["id"], "adjustment_id": adj["id"], "customer_id": world.customer.id,
        "mandate_id": mandate["id"], "fee_schedule_id": fee_schedule_create(asset_code="JPY", rate=Decimal("0.01")).pk,
        "event_id": OutboxEvent.objects.get(topic="payment.succeeded", payload__id=payment["id"]).pk,
        "merchant_id": world.merchant.id, "store_id": world.store.pk, "terminal_id": world.terminal.id,
        # a throwaway key: the matrix rotates and revokes it
        "api_key_id": api_key_create(principal=bystander)[0].pk,
    }
    return Objects(ids=ids, secrets=[hook["secret"], world.customer.key, world.merchant.key, world.terminal.key, world.staff.key])


def _payout(api: Api, world: World) -> dict[str, Any]:
    """A payout of the world's merchant (funds available, a bank account at the simulator)."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.models import MerchantBankAccount
    from payments.services.payouts import bank_account_attach
    from tests.payouts_support import fund

    fund(world.merchant.obj, 1_000, days_ago=3)
    bank_account_attach(merchant=world.merchant.obj, token="btok_bank", staff=world.staff.obj)
    MerchantBankAccount.objects.filter(merchant=world.merchant.obj).update(changed_at=timezone.now() - timedelta(days=8))
    response = api.post("/v1/merchant/payouts", world.merchant.key, {"asset": "JPY", "amount": 300})
    assert response.status_code == 201, response.content
    return dict(response.json())


def _routes(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(route, callback) of every pattern, walking the includes (one router per face)."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern).lstrip("^").rstrip("$")
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        else:
            yield route, pattern.callback


def _endpoints() -> list[tuple[str, str, str]]:
    """(method, path template, face) of every /v1/ face route, read from the URLconf so a new
    endpoint cannot escape the matrix."""
    out: list[tuple[str, str, str]] = []
    for route, callback in _routes(get_resolver("config.api_urls").url_patterns):
        template = "/v1/" + re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)
        face = route.split("/")[0]
        for method in ("get", "post"):
            if method in callback.actions:  # the viewset's action map (routers only serve viewsets)
                out.append((method.upper(), template, face))
    return out


ENDPOINTS = _endpoints()


def test_matrix_covers_every_face_route() -> None:
    faces = {face for _, _, face in ENDPOINTS}
    assert faces == {"customer", "terminal", "merchant", "admin"}
    assert len(ENDPOINTS) >= 50


def _assert_no_leak(body: bytes, objects: Objects, path: str) -> None:
    text = body.decode()
    for secret in objects.secrets:
        assert secret not in text, path
    parsed = json.loads(body)
    assert set(parsed) == {"error"}, (path, parsed)


# The same type, but not the owner -> 404 on object routes (lists just show nothing of it).
def _other_owner(world: World, face: str) -> str:
    return {"customer": world.customer2.key, "terminal": world.terminal2.key, "merchant": world.merchant2.key, "admin": ""}[face]


def test_every_endpoint_every_principal(api: Api, world: World, world_b: World, objects: Objects) -> None:
    keys_a = {"customer": world.customer.key, "terminal": world.terminal.key, "merchant": world.merchant.key, "staff": world.staff.key}
    keys_b = {"customer": world_b.customer.key, "terminal": world_b.terminal.key, "merchant": world_b.merchant.key, "staff": world_b.staff.key}
    checked = 0
    for method, template, face in ENDPOINTS:
        path = template.format(**objects.ids)
        body: Any = {} if method == "POST" else None
        # no key, garbage key, revoked-looking key of the right prefix
        for key in (None, "garbage", {"customer": "ck_", "terminal": "tk_", "merchant": "sk_", "admin": "ak_"}[face] + "x" * 40):
            r = api.call(method, path, key, body)
            assert r.status_code == 401, (method, path, key, r.status_code)
            _assert_no_leak(r.content, objects, path)
        for ptype, key in keys_a.items():
            r = api.call(method, path, key, body)
            if FACE_OF_TYPE[ptype] != face:
                assert r.status_code == 403, (method, path, ptype, r.status_code)
                assert error_of(r)["type"] == "permission_error"
                _assert_no_leak(r.content, objects, path)
        # a principal of the same type from the other tenant: its key is unknown here
        r = api.call(method, path, keys_b[{"admin": "staff"}.get(face, face)], body)
        assert r.status_code == 401, (method, path, "tenant b", r.status_code)
        _assert_no_leak(r.content, objects, path)
        # another tenant's host with this tenant's key: unknown there too
        r = Api(world_b.host).call(method, path, keys_a[{"admin": "staff"}.get(face, face)], body)
        assert r.status_code in (401, 404), (method, path, "key of a on host b", r.status_code)
        _assert_no_leak(r.content, objects, path)
        other = _other_owner(world, face)
        if other and "{" in template:
            r = api.call(method, path, other, body)
            assert r.status_code == 404, (method, path, "other owner", r.status_code, r.content)
            _assert_no_leak(r.content, objects, path)
        checked += 1
    assert checked == len(ENDPOINTS)


# The query a list needs (a statement is of one asset over a period); the others need none.
_MONTH = f"{datetime.now(UTC):%Y-%m}"
LIST_QUERY = {path: {"asset": "JPY", "month": _MONTH} for path in ("/v1/customer/statements", "/v1/merchant/statements")}


def test_lists_show_nothing_of_other_owners(api: Api, world: World, objects: Objects) -> None:
    for method, template, face in ENDPOINTS:
        other = _other_owner(world, face)
        if method != "GET" or "{" in template or not other:
            continue
        r = api.get(template, other, LIST_QUERY.get(template))
        assert r.status_code == 200, (template, r.content)
        text = r.content.decode()
        for name, value in objects.ids.items():
            if name in {"merchant_id", "customer_id", "api_key_id"}:
                continue
            assert value not in text, (template, name)
