"""GET /v1/merchant/events: the merchant's own events of the last 30 days, exactly as its
webhooks carry them, so a receiver whose endpoint was down or disabled can catch up
(SPEC 8); cursor-paginated and filtered like the other lists; another merchant's or
tenant's events are never seen."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from payments.models import OutboxEvent
from payments.services.adjustments import adjustment_create
from tests.api.conftest import Api, World, error_of
from webhooks.selectors import merchant_event_list
from webhooks.services.deliveries import webhook_event_body


def _paid(api: Api, world: World, amount: int) -> dict[str, Any]:
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": amount})
    assert r.status_code == 201, r.content
    return r.json()  # type: ignore[no-any-return]


def _events(api: Api, key: str, **params: Any) -> Any:
    r = api.get("/v1/merchant/events", key, params)
    assert r.status_code == 200, r.content
    return r.json()


def test_a_merchant_lists_its_own_events_as_its_webhooks_carry_them(api: Api, world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    payments = [_paid(api, world, amount) for amount in (101, 102, 103)]
    refund = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": payments[0]["id"], "amount": 1}).json()
    mine = list(OutboxEvent.objects.filter(payload__merchant=world.merchant.id).order_by("-created", "-id"))
    assert {e.topic for e in mine} >= {"payment.succeeded", "refund.succeeded"}

    listed = _events(api, world.merchant.key)
    assert listed["object"] == "list" and listed["next_cursor"] is None
    # Each one byte for byte the body its deliveries sign: id, type, created, sequence, the object's state.
    assert listed["data"] == [json.loads(webhook_event_body(event=e)) for e in mine]
    assert {e["data"]["object"]["id"] for e in listed["data"]} >= {p["id"] for p in payments} | {refund["id"]}

    # By type, and page by page with the cursor (nothing missed, nothing twice).
    succeeded = _events(api, world.merchant.key, type="payment.succeeded")["data"]
    assert [e["id"] for e in succeeded] == [e.id for e in mine if e.topic == "payment.succeeded"]
    seen, cursor = [], None
    while True:
        page = _events(api, world.merchant.key, limit=1, **({"cursor": cursor} if cursor else {}))
        seen += [e["id"] for e in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [e.id for e in mine]

    # One retrieved.
    r = api.get(f"/v1/merchant/events/{mine[0].id}", world.merchant.key)
    assert r.status_code == 200 and r.json() == json.loads(webhook_event_body(event=mine[0]))


def test_created_filters_are_the_lists_own(api: Api, world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    for amount in (1, 2, 3):
        _paid(api, world, amount)
    events = list(OutboxEvent.objects.filter(payload__merchant=world.merchant.id).order_by("created", "id"))
    base = timezone.now() - timedelta(days=3)
    for n, event in enumerate(events):  # one a day apart, so the bounds are unambiguous
        OutboxEvent.objects.filter(pk=event.pk).update(created=base + timedelta(days=n))
    middle = (base + timedelta(days=1)).isoformat()

    def ids(**params: Any) -> list[str]:
        return [e["id"] for e in _events(api, world.merchant.key, **params)["data"]]

    first, second, third = (e.id for e in events)
    assert ids(created_gte=middle) == [third, second]
    assert ids(created_gt=middle) == [third]
    assert ids(created_lte=middle) == [second, first]
    assert ids(created_lt=middle) == [first]
    r = api.get("/v1/merchant/events", world.merchant.key, {"created_gt": "yesterday"})
    assert r.status_code == 400 and error_of(r)["param"] == "created_gt"
    r = api.get("/v1/merchant/events", world.merchant.key, {"type": "*"})
    assert r.status_code == 400 and error_of(r)["param"] == "type"


def test_events_older_than_30_days_are_not_listed(api: Api, world: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    _paid(api, world, 5)
    event = OutboxEvent.objects.get(payload__merchant=world.merchant.id, topic="payment.succeeded")
    OutboxEvent.objects.filter(pk=event.pk).update(created=timezone.now() - timedelta(days=30, minutes=1))
    assert event.id not in [e["id"] for e in _events(api, world.merchant.key)["data"]]
    r = api.get(f"/v1/merchant/events/{event.id}", world.merchant.key)
    assert r.status_code == 404 and error_of(r)["code"] == "resource_missing"


def test_another_merchants_events_are_never_seen(api: Api, world: World, world_b: World) -> None:
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10_000, direction="credit", reason="seed")
    _paid(api, world, 7)
    event = OutboxEvent.objects.get(payload__merchant=world.merchant.id, topic="payment.succeeded")
    assert _events(api, world.merchant2.key)["data"] == []
    for key, host_api in ((world.merchant2.key, api), (world.merchant.key, Api(world_b.host))):
        r = host_api.get(f"/v1/merchant/events/{event.id}", key)
        assert r.status_code in (401, 404) and set(r.json()) == {"error"}, r.content
    r = api.get(f"/v1/merchant/events/{event.id}", world.merchant2.key)
    assert r.status_code == 404 and error_of(r)["code"] == "resource_missing" and event.id not in r.content.decode()
    assert _events(Api(world_b.host), world_b.merchant.key)["data"] == []  # tenant b's merchant: its own schema


def test_the_list_reads_the_merchant_index(world: World) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = merchant_event_list(merchant_id=world.merchant.id).order_by("-created", "-pk")[:21].explain()
    assert "outbox_merchant_created" in plan, plan


def test_an_adjustment_event_names_no_staff_member_and_carries_no_staff_note(api: Api, world: World) -> None:
    """A merchant adjustment's event reaches the merchant (webhooks and this list): the
    staff member who posted it and the free-text reason stay in the audit log."""
    adjustment = adjustment_create(
        staff=world.staff.obj, merchant=world.merchant.obj, asset_code="JPY", amount=700, direction="credit", reason="internal: ticket 4411",
    )
    [event] = [e for e in _events(api, world.merchant.key, type="adjustment.created")["data"] if e["data"]["object"]["id"] == adjustment.id]
    obj = event["data"]["object"]
    assert (obj["merchant"], obj["amount"], obj["direction"]) == (world.merchant.id, 700, "credit")
    assert "staff" not in obj and "reason" not in obj
    assert "ticket 4411" not in json.dumps(event)
