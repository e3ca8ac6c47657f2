"""Fees on the API and in the back office: `/v1/admin/fee_schedules` (create, list, retrieve,
idempotent, every bad input a 4xx that adds nothing), `fee` and `net` on payments and
captures of every face but the customer's, `fee` on refunds (not the customer's), and the Django admin's add page (finance) and the
dashboard's fee revenue."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from payments.api.serializers import RateField
from payments.models import FeeSchedule
from tests.api.conftest import Api, World, error_of
from tests.api.test_backoffice import _confirm_key, _login
from tests.api.test_money_endpoints import fund
from tests.test_fees import schedule
from wallets.models import AuditEntry

URL = "/v1/admin/fee_schedules"


def _body(**change: Any) -> dict[str, Any]:
    return {"asset": "JPY", "rate": "0.029", **change}


def test_a_schedule_is_created_listed_retrieved_and_replayed(api: Api, world: World) -> None:
    key = uuid.uuid4().hex
    start = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    body = _body(merchant=world.merchant.id, rounding="ROUND_FLOOR", fixed=30, valid_from=start.isoformat())
    r = api.post(URL, world.staff.key, body, idem=key)
    assert r.status_code == 201, r.content
    made = r.json()
    assert made["id"].startswith("fee_") and made["object"] == "fee_schedule"
    assert {k: made[k] for k in ("asset", "merchant", "rate", "rounding", "fixed")} == {
        "asset": "JPY", "merchant": world.merchant.id, "rate": "0.029000", "rounding": "ROUND_FLOOR", "fixed": 30,
    }
    assert datetime.fromisoformat(made["valid_from"].replace("Z", "+00:00")) == start
    replay = api.post(URL, world.staff.key, body, idem=key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true" and replay.content == r.content
    assert FeeSchedule.objects.filter(merchant=world.merchant.obj).count() == 1
    assert AuditEntry.objects.filter(action="fee_schedule.create", target_id=made["id"]).count() == 1
    assert api.get(f"{URL}/{made['id']}", world.staff.key).json() == made
    assert api.get(URL, world.staff.key).json()["data"][0] == made
    wide = api.post(URL, world.staff.key, {"asset": "JPY", "rate": "0"})  # tenant-wide, from the earliest start
    assert wide.status_code == 201 and wide.json()["merchant"] is None and wide.json()["rounding"] == "ROUND_HALF_EVEN"
    assert api.get(f"{URL}/fee_nothere", world.staff.key).status_code == 404


BAD = [
    (_body(rate=0.029), "rate"), (_body(rate=1), "rate"), (_body(rate="1.5"), "rate"), (_body(rate="-0.1"), "rate"),
    (_body(rate="0.0000001"), "rate"), (_body(rate="abc"), "rate"), (_body(rate="NaN"), "rate"), (_body(rate="1e3"), "rate"),
    (_body(rate=""), "rate"), (_body(rate=None), "rate"), ({"asset": "JPY"}, "rate"),
    (_body(rounding="ROUND_05UP"), "rounding"), (_body(rounding=1), "rounding"),
    (_body(fixed=-1), "fixed"), (_body(fixed="5"), "fixed"), (_body(fixed=1.5), "fixed"), (_body(fixed=True), "fixed"),
    (_body(fixed=10**16), "fixed"),
    (_body(valid_from="2020-01-01T00:00:00Z"), "valid_from"), (_body(valid_from="tomorrow"), "valid_from"),
    (_body(valid_from="0001-01-01T00:30:00+01:00"), "valid_from"), (_body(valid_from=5), "valid_from"),
    (_body(merchant="mer_nobody"), "merchant"), (_body(merchant="cus_x"), "merchant"), (_body(merchant=5), "merchant"),
    (_body(asset="XXX"), "asset"), (_body(asset="jpy"), "asset"), ({"rate": "0.1"}, "asset"),
    (_body(ratee="0.1"), "ratee"),
]


@pytest.mark.parametrize(("body", "param"), BAD)
def test_every_bad_input_is_a_4xx_in_the_envelope_that_adds_nothing(api: Api, world: World, body: dict[str, Any], param: str) -> None:
    before = (FeeSchedule.objects.count(), AuditEntry.objects.count())
    r = api.post(URL, world.staff.key, body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.content)
    assert error_of(r)["param"] == param, (body, r.content)
    assert (FeeSchedule.objects.count(), AuditEntry.objects.count()) == before


@pytest.mark.parametrize("rate", [0.029, 0, 1, Decimal("0.029")])
def test_a_rate_is_a_json_string_never_a_number(api: Api, world: World, rate: Any) -> None:
    """DRF's CharField would take 0.029 as "0.029": a float on the way in is not a rate. The
    field refuses it itself, whatever serializer holds it."""
    r = api.post(URL, world.staff.key, _body(rate=float(rate) if isinstance(rate, Decimal) else rate))
    assert r.status_code == 400 and error_of(r)["param"] == "rate" and "string" in error_of(r)["message"], r.content
    with pytest.raises(ValidationError) as refused:
        RateField().run_validation(rate)
    assert "JSON string, not a number" in str(refused.value.detail)
    assert RateField().run_validation("0.029") == Decimal("0.029")


def test_a_second_schedule_at_the_same_start_is_refused(api: Api, world: World) -> None:
    start = (timezone.now() + timedelta(hours=2)).isoformat()
    assert api.post(URL, world.staff.key, _body(valid_from=start)).status_code == 201
    r = api.post(URL, world.staff.key, _body(rate="0.5", valid_from=start))
    assert r.status_code == 409 and error_of(r)["param"] == "valid_from" and error_of(r)["code"] == "fee_schedule_start_refused"
    r = api.post(URL, world.staff.key, _body(valid_from=timezone.now().isoformat()))  # too soon: not every process knows it yet
    assert r.status_code == 409 and error_of(r)["code"] == "fee_schedule_start_refused"
    assert FeeSchedule.objects.filter(merchant=None, valid_from=start).count() == 1


def test_payments_captures_and_refunds_carry_the_fee_on_every_face(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 10_000)
    schedule(merchant=world.merchant.obj, rate="0.05", fixed=1)
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1_000})
    assert r.status_code == 201 and (r.json()["fee"], r.json()["net"]) == (51, 949)
    paid = r.json()["id"]
    for path, key in ((f"/v1/terminal/payments/{paid}", world.terminal.key), (f"/v1/merchant/payments/{paid}", world.merchant.key)):
        shown = api.get(path, key).json()
        assert (shown["amount"], shown["fee"], shown["net"]) == (1_000, 51, 949), path
    refund = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid, "amount": 500}).json()
    assert refund["fee"] == 25  # floor(51 x 500 / 1000)
    assert api.get(f"/v1/merchant/refunds/{refund['id']}", world.merchant.key).json()["fee"] == 25
    assert api.get("/v1/merchant/refunds", world.merchant.key).json()["data"][0]["fee"] == 25
    # The customer face never shows the merchant's fee or net, one object or a list.
    customer_shown = [api.get(f"/v1/customer/payments/{paid}", world.customer.key).json(),
                      api.get("/v1/customer/payments", world.customer.key).json()["data"][0],
                      api.get(f"/v1/customer/refunds/{refund['id']}", world.customer.key).json(),
                      api.get("/v1/customer/refunds", world.customer.key).json()["data"][0]]
    assert customer_shown[0]["amount"] == 1_000 and customer_shown[2]["amount"] == 500
    assert not any({"fee", "net"} & set(shown) for shown in customer_shown), customer_shown

    intent = api.post("/v1/merchant/payment_intents", world.merchant.key,
                      {"customer": world.customer.id, "asset": "JPY", "amount": 400, "capture_method": "manual"}).json()
    assert (intent["fee"], intent["net"]) == (None, None)
    api.post(f"/v1/merchant/payment_intents/{intent['id']}/authorize", world.merchant.key, {})
    captured = api.post(f"/v1/merchant/payment_intents/{intent['id']}/capture", world.merchant.key, {"amount_to_capture": 300}).json()
    assert captured["status"] == "captured" and (captured["fee"], captured["net"]) == (16, 284)
    assert api.get(f"/v1/merchant/payments/{captured['payment']}", world.merchant.key).json()["fee"] == 16
    listed = api.get("/v1/merchant/payment_intents", world.merchant.key).json()["data"]
    assert (listed[0]["fee"], listed[0]["net"]) == (16, 284)


def test_a_schedule_made_on_the_api_applies_from_its_start(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_FEE_SCHEDULE_CACHE_SECONDS, settings.TALLY_FEE_SCHEDULE_GRACE_SECONDS = 0.0, 0.2
    fund(world, world.customer.obj, 10_000)
    made = api.post(URL, world.staff.key, _body(merchant=world.merchant.id, rate="0.1")).json()
    pay = {"customer": world.customer.id, "asset": "JPY", "amount": 1_000}
    assert api.post("/v1/terminal/payments", world.terminal.key, pay).json()["fee"] == 0  # not started yet
    start = datetime.fromisoformat(made["valid_from"].replace("Z", "+00:00"))
    FeeSchedule.objects.filter(pk=made["id"]).update(valid_from=start - timedelta(seconds=1))  # as if its start had come
    assert api.post("/v1/terminal/payments", world.terminal.key, pay).json()["fee"] == 100


# --- the back office ---------------------------------------------------------------------


def test_finance_adds_a_schedule_in_the_back_office_once_per_confirmation(world: World) -> None:
    finance = _login(f"fin-fee-{uuid.uuid4().hex[:6]}", role="finance")
    listing = finance.get("/admin/payments/feeschedule/")
    assert listing.status_code == 200 and b"/admin/payments/feeschedule/add/" in listing.content
    page = finance.get("/admin/payments/feeschedule/add/")
    assert page.status_code == 200 and b"never edited" in page.content and b"Valid from (UTC)" in page.content
    start = (timezone.now() + timedelta(days=2)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    form = {"idempotency_key": _confirm_key(page), "asset": "JPY", "merchant": world.merchant.id, "rate": "0.015",
            "rounding": "ROUND_HALF_UP", "fixed": "3", "valid_from": start}
    assert finance.post("/admin/payments/feeschedule/add/", form).status_code == 302
    assert finance.post("/admin/payments/feeschedule/add/", form).status_code == 302  # the same confirmation again: once
    made = FeeSchedule.objects.get(merchant=world.merchant.obj)
    assert (made.rate, made.rounding, made.fixed) == (Decimal("0.015"), "ROUND_HALF_UP", 3)
    assert AuditEntry.objects.filter(action="fee_schedule.create", target_id=made.pk).count() == 1
    refused = finance.post("/admin/payments/feeschedule/add/", {**form, "idempotency_key": uuid.uuid4().hex, "valid_from": "2020-01-01 00:00:00"})
    assert refused.status_code == 200 and b"valid_from must be at or after" in refused.content
    page = finance.get(f"/admin/payments/feeschedule/{made.pk}/change/")
    assert page.status_code == 200 and b'name="rate"' not in page.content  # shown, never edited
    assert finance.post(f"/admin/payments/feeschedule/{made.pk}/change/", {"rate": "0.5"}).status_code == 403
    assert FeeSchedule.objects.get(pk=made.pk).rate == Decimal("0.015")


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_finance_adds_schedules(world: World, role: str) -> None:
    client = _login(f"{role}-fee-{uuid.uuid4().hex[:6]}", role=role)
    assert client.get("/admin/payments/feeschedule/").status_code == 200
    assert client.get("/admin/payments/feeschedule/add/").status_code == 403
    form = {"idempotency_key": uuid.uuid4().hex, "asset": "JPY", "rate": "0.1", "rounding": "ROUND_HALF_UP", "fixed": "0"}
    assert client.post("/admin/payments/feeschedule/add/", form).status_code == 403
    assert not FeeSchedule.objects.exists()


def test_the_dashboard_shows_fee_revenue_per_day_and_asset(api: Api, world: World) -> None:
    fund(world, world.customer.obj, 10_000)
    schedule(merchant=world.merchant.obj, rate="0.1", fixed=0)
    paid = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1_000}).json()
    api.post("/v1/merchant/refunds", world.merchant.key, {"payment": paid["id"], "amount": 300})
    page = _login(f"root-fee-{uuid.uuid4().hex[:6]}", superuser=True).get("/admin/reconciliation/reconciliationrun/dashboard/")
    body = page.content.decode()
    assert page.status_code == 200 and 'id="chart-fees-jpy"' in body and "Daily fee revenue, JPY" in body
    assert f"{timezone.localdate():%m-%d}: 70</title>" in body  # 100 taken, 30 given back
