"""A request body is read whole before anything runs, or the request is refused (SPEC 1).

WSGI hands Django a chunked body (no Content-Length) as empty, so without the refusal a
view would run on `{}`: a capture of 50 would capture everything. The in-process test builds the environ gunicorn
builds; the live tests send raw bytes to a real gunicorn, which the test client never does
(nor can it send a body shorter than its Content-Length).
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from payments.models import Payment, PaymentIntent
from payments.services.adjustments import adjustment_create
from payments.services.intents import payment_intent_authorize, payment_intent_create
from tests.api.conftest import Api, World, error_of
from tests.conftest import TENANT_A
from tests.live import gunicorn_running
from wallets.services.principals import (
    api_key_create,
    customer_create,
    merchant_create,
    staff_member_get_or_create,
    store_create,
    terminal_create,
)

ROOT = Path(__file__).resolve().parents[2]


def _fund(world_staff: Any, customer: Any, amount: int) -> None:
    adjustment_create(staff=world_staff, customer=customer, asset_code="JPY", amount=amount, direction="credit", reason="test")


def test_a_chunked_capture_is_refused_and_captures_nothing(api: Api, world: World) -> None:
    _fund(world.staff.obj, world.customer.obj, 1_000)
    intent = payment_intent_create(merchant=world.merchant.obj, customer=world.customer.obj, asset_code="JPY", amount=200, capture_method="manual")
    payment_intent_authorize(intent=intent)
    body = json.dumps({"amount_to_capture": 50}).encode()
    # What gunicorn passes for `Transfer-Encoding: chunked`: no CONTENT_LENGTH at all.
    response = api.client.generic(
        "POST", f"/v1/merchant/payment_intents/{intent.pk}/capture", body, content_type="application/json",
        CONTENT_LENGTH="", HTTP_TRANSFER_ENCODING="chunked",
        HTTP_AUTHORIZATION=f"Bearer {world.merchant.key}", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex,
    )
    assert response.status_code == 411, response.content
    assert error_of(response)["code"] == "length_required"
    assert PaymentIntent.objects.get(pk=intent.pk).status == "authorized"


# --- Against a live gunicorn, raw bytes on a socket ----------------------------------------


@pytest.fixture
def live_parties(live_tenant: Any) -> dict[str, Any]:
    """Committed parties in tenant A with keys (a live server cannot see a test transaction)."""
    suffix = uuid.uuid4().hex[:8]
    staff = staff_member_get_or_create(username=f"bodies-{suffix}")
    customer = customer_create(name=f"Chunky {suffix}")
    merchant = merchant_create(name=f"Shop {suffix}")
    terminal = terminal_create(store=store_create(merchant=merchant, name="S"), name="T")
    _fund(staff, customer, 1_000)
    intent = payment_intent_create(merchant=merchant, customer=customer, asset_code="JPY", amount=200, capture_method="manual")
    payment_intent_authorize(intent=intent)
    return {
        "customer": customer, "intent": intent,
        "terminal_key": api_key_create(principal=terminal)[1], "merchant_key": api_key_create(principal=merchant)[1],
    }


@pytest.fixture
def gunicorn(live_tenant: Any) -> Iterator[int]:
    with gunicorn_running() as port:
        yield port


def _raw(port: int, head: str, body: bytes = b"", *, then_close: bool = False) -> tuple[int, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        if then_close:
            sock.shutdown(socket.SHUT_WR)  # the client stops sending: no more body is coming
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")


def _chunked(payload: dict[str, Any]) -> bytes:
    raw = json.dumps(payload).encode()
    return f"{len(raw):x}\r\n".encode() + raw + b"\r\n0\r\n\r\n"


def _head(path: str, key: str, idem: str, *, chunked: bool, length: int = 0) -> str:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {TENANT_A['domain']}\r\nAuthorization: Bearer {key}\r\nIdempotency-Key: {idem}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\nConnection: close\r\n\r\n"
    )


def test_live_chunked_capture_and_payment_are_refused(gunicorn: int, live_parties: dict[str, Any]) -> None:
    intent = live_parties["intent"]
    status, body = _raw(
        gunicorn, _head(f"/v1/merchant/payment_intents/{intent.pk}/capture", live_parties["merchant_key"], uuid.uuid4().hex, chunked=True),
        _chunked({"amount_to_capture": 50}),
    )
    assert (status, body["error"]["code"]) == (411, "length_required")
    assert PaymentIntent.objects.get(pk=intent.pk).status == "authorized"

    # The same key: first with a proper body (a payment of 5), then chunked with another
    # body. The contract says 422 for a changed request; it must at least never replay.
    key, customer = uuid.uuid4().hex, live_parties["customer"]
    first = json.dumps({"customer": customer.pk, "asset": "JPY", "amount": 5}).encode()
    status, paid = _raw(gunicorn, _head("/v1/terminal/payments", live_parties["terminal_key"], key, chunked=False, length=len(first)), first)
    assert status == 201, paid
    status, body = _raw(
        gunicorn, _head("/v1/terminal/payments", live_parties["terminal_key"], key, chunked=True),
        _chunked({"customer": customer.pk, "asset": "JPY", "amount": 7}),
    )
    assert (status, body["error"]["code"]) == (411, "length_required")
    assert list(Payment.objects.filter(customer_id=customer.pk).values_list("amount", flat=True)) == [5]


def test_live_body_shorter_than_its_content_length_is_refused(gunicorn: int, live_parties: dict[str, Any]) -> None:
    customer = live_parties["customer"]
    body = json.dumps({"customer": customer.pk, "asset": "JPY", "amount": 5}).encode()
    status, answer = _raw(
        gunicorn, _head("/v1/terminal/payments", live_parties["terminal_key"], uuid.uuid4().hex, chunked=False, length=len(body) + 20),
        body, then_close=True,
    )
    assert (status, answer["error"]["code"]) == (400, "request_body_incomplete")
    assert not Payment.objects.filter(customer_id=customer.pk).exists()


# --- Errors gunicorn answers before Django sees the request ---------------------------------


def _raw_response(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ", 2)[1]), headers, body


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"GET /v1/customer/payments?q=" + b"x" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414, "request_uri_too_long"),
        (b"GET /v1/customer/payments HTTP/1.1\r\nHost: a\r\nX-Bad\x01Name: 1\r\n\r\n", 400, "request_malformed"),
        (b"POST /v1/terminal/payments HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400, "request_malformed"),
        (b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(120)) + b"\r\n", 431, "request_headers_too_large"),
    ],
    ids=["uri-too-long", "bad-header-bytes", "length-with-chunked", "too-many-headers"],
)
def test_errors_gunicorn_answers_itself_are_the_envelope(gunicorn: int, request_bytes: bytes, status: int, code: str) -> None:
    got_status, headers, body = _raw_response(gunicorn, request_bytes)
    assert got_status == status, body
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store"
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert error["request_id"] == headers["request-id"] and headers["request-id"].startswith("req_")
    assert b"X-Bad" not in body  # the offending bytes are never echoed
