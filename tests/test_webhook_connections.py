"""A drain's deliveries share one kept connection (webhooks.transport.WebhookConnections),
and only when that is safe: real sockets, receivers that keep, close, or say nothing."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

import webhooks.transport as transport
from tenants.models import Tenant
from tests.factories import MerchantFactory
from tests.receivers import receiver_running
from tests.test_webhooks import _endpoint, _event
from webhooks.models import WebhookDelivery
from webhooks.services.deliveries import webhook_deliveries_dispatch
from webhooks.services.relay import outbox_batch_publish
from webhooks.targets import Target

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class RawReceiver:
    """An HTTP/1.1 receiver on raw sockets, so each test picks how a connection ends.
    `answer(connection_number, request_number_on_it)` returns the bytes to send and whether
    to close the connection after them; None sends nothing and holds the connection."""

    answer: Any
    port: int = 0
    requests: list[tuple[int, bytes]] = field(default_factory=list)  # (connection number, body)
    connections: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def target(self) -> Target:
        return Target(scheme="http", host="127.0.0.1", port=self.port, path="/hook", address="127.0.0.1")

    def serve(self, conn: socket.socket, number: int) -> None:
        with conn, contextlib.suppress(OSError):  # the client may reset a connection it left unread
            buffer, served = b"", 0
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append((number, body))
                served += 1
                reply = self.answer(number, served)
                if reply is None:
                    self.stop.wait(30)
                    return
                data, close = reply
                conn.sendall(data)
                if close:
                    return


@contextmanager
def raw_receiver(answer: Any, host: str = "127.0.0.1") -> Iterator[RawReceiver]:
    rx = RawReceiver(answer=answer)
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(16)
    listener.settimeout(0.1)
    rx.port = listener.getsockname()[1]

    def accept() -> None:
        while not rx.stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            rx.connections += 1
            threading.Thread(target=rx.serve, args=(conn, rx.connections), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield rx
    finally:
        rx.stop.set()
        acceptor.join(timeout=5)
        listener.close()


def _post_all(rx: RawReceiver, count: int) -> list[int]:
    with transport.WebhookConnections() as connections:
        return [connections.post(target=rx.target(), body=b"event %d" % n, headers={}).status for n in range(count)]


def test_a_receiver_that_keeps_the_connection_gets_every_event_on_one() -> None:
    with raw_receiver(lambda number, served: (OK, False)) as rx:
        assert _post_all(rx, 5) == [200] * 5
    assert rx.connections == 1 and [body for _, body in rx.requests] == [b"event %d" % n for n in range(5)]


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9000\r\n\r\n" + b"x" * 9000,  # longer than the read: left unread
    ],
    ids=["connection-close", "http-1.0", "answer-not-read-whole"],
)
def test_a_connection_that_may_not_carry_another_request_is_not_reused(reply: bytes) -> None:
    with raw_receiver(lambda number, served: (reply, False)) as rx:
        assert _post_all(rx, 3) == [200] * 3
    assert rx.connections == 3 and [number for number, _ in rx.requests] == [1, 2, 3]


def test_a_kept_connection_the_receiver_closed_is_replaced_and_nothing_is_lost_or_doubled() -> None:
    """The receiver answers as if it kept the connection, then closes it (an idle timeout):
    the next request finds it closed and goes once more on a new one."""
    with raw_receiver(lambda number, served: (OK, True)) as rx:
        assert _post_all(rx, 4) == [200] * 4
    assert [body for _, body in rx.requests] == [b"event %d" % n for n in range(4)]
    assert rx.connections == 4


def test_a_timeout_on_a_kept_connection_is_not_sent_again(monkeypatch: Any) -> None:
    """A slow receiver must cost one timeout, not two: only a closed connection is retried."""
    monkeypatch.setattr(transport, "READ_TIMEOUT_SECONDS", 0.5)
    with raw_receiver(lambda number, served: (OK, False) if served == 1 else None) as rx:
        with transport.WebhookConnections() as connections:
            assert connections.post(target=rx.target(), body=b"first", headers={}).status == 200
            with pytest.raises(TimeoutError):
                connections.post(target=rx.target(), body=b"second", headers={})
    assert rx.requests == [(1, b"first"), (1, b"second")]


def test_a_delivery_to_another_address_gets_a_new_connection() -> None:
    """The name resolved elsewhere (or another endpoint): the kept connection is closed, not used."""
    with raw_receiver(lambda number, served: (OK, False), host="0.0.0.0") as rx:  # 127.0.0.2 reaches it too
        elsewhere = Target(scheme="http", host="127.0.0.1", port=rx.port, path="/hook", address="127.0.0.2")
        with transport.WebhookConnections() as connections:
            connections.post(target=rx.target(), body=b"a", headers={})
            connections.post(target=elsewhere, body=b"b", headers={})
            connections.post(target=rx.target(), body=b"c", headers={})
    assert [number for number, _ in rx.requests] == [1, 2, 3]


def test_a_drain_sends_its_deliveries_on_one_connection_and_closes_it(tenant: Tenant, loopback_http: None) -> None:
    merchant = MerchantFactory()
    with receiver_running() as rx:
        _endpoint(merchant, rx.url())
        events = [_event(merchant, n) for n in range(6)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 6
        assert rx.event_ids() == [e.id for e in events] and rx.connections == 1
        more = [_event(merchant, n) for n in range(6, 8)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 2  # a new drain, a new connection
        assert rx.event_ids()[6:] == [e.id for e in more] and rx.connections == 2
    assert set(WebhookDelivery.objects.filter(event__in=events + more).values_list("status", flat=True)) == {"succeeded"}


@pytest.fixture
def loopback_http(settings: Any) -> None:
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = True
