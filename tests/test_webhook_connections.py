"""A relay run's deliveries reuse kept connections (webhooks.transport.WebhookConnections),
one per request in flight to an endpoint, and only when that is safe: real sockets,
receivers that keep, close, or say nothing."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
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
from webhooks.models import WebhookDelivery, WebhookDeliveryAttempt, WebhookEndpoint
from webhooks.services.deliveries import webhook_deliveries_dispatch, webhook_kept_connections_close
from webhooks.services.relay import outbox_batch_publish
from webhooks.targets import Target

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture(autouse=True)
def _loopback_allowed(loopback_http: None) -> None:
    """The receivers listen on loopback, which a connection checks as it opens its socket."""


@dataclass
class RawReceiver:
    """An HTTP/1.1 receiver on raw sockets, so each test picks how a connection ends.
    `answer(connection_number, request_number_on_it)` returns the bytes to send and whether
    to close the connection after them (then, bytes to send after a pause, before closing);
    None sends nothing and holds the connection; "drop" closes it unanswered, "reset"
    resets it unanswered."""

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
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append((number, body))
                served += 1
                reply = self.answer(number, served)
                if reply is None:
                    self.stop.wait(30)
                    return
                if reply == "drop":
                    return
                if reply == "reset":  # an abortive close: the client reads ECONNRESET
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                data, close, *after = reply
                conn.sendall(data)
                if after:
                    time.sleep(0.1)
                    conn.sendall(after[0])
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


def _post_all(rx: RawReceiver, count: int, *, pause: float = 0.0) -> list[int]:
    statuses = []
    with transport.WebhookConnections() as connections:
        for n in range(count):
            statuses.append(connections.post(target=rx.target(), body=b"event %d" % n, headers={}).status)
            time.sleep(pause)
    return statuses


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
    the next request sees it closed and goes on a new one."""
    with raw_receiver(lambda number, served: (OK, True, b"")) as rx:  # closes 0.1 s after answering
        assert _post_all(rx, 4, pause=0.3) == [200] * 4
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


def test_bytes_after_an_answer_are_never_read_as_the_next_answer() -> None:
    """A receiver (or a proxy) that writes to the idle connection (a 408 it means to close
    after): the next delivery goes on a new connection and gets its own answer, not the 408."""
    stray = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"
    with raw_receiver(lambda number, served: (OK, False, stray) if number == 1 else (OK, False)) as rx:
        with transport.WebhookConnections() as connections:
            assert connections.post(target=rx.target(), body=b"one", headers={}).status == 200
            time.sleep(0.3)  # the stray answer arrives while the connection sits idle
            assert connections.post(target=rx.target(), body=b"two", headers={}).status == 200
    assert rx.requests == [(1, b"one"), (2, b"two")]


def test_a_reset_after_the_request_went_is_not_sent_again() -> None:
    """The receiver resets the kept connection once our request has gone. It may have
    processed the request first (nothing on the wire tells), so the attempt fails and the
    retry schedule sends it, not this call."""
    with raw_receiver(lambda number, served: (OK, False) if served == 1 else "reset") as rx:
        with transport.WebhookConnections() as connections:
            assert connections.post(target=rx.target(), body=b"first", headers={}).status == 200
            with pytest.raises(ConnectionResetError):
                connections.post(target=rx.target(), body=b"second", headers={})
    assert rx.requests == [(1, b"first"), (1, b"second")] and connections.opened == 1


def test_a_receiver_that_drops_a_request_it_took_is_not_sent_it_again() -> None:
    """It read the request, then closed without answering (a worker killed, a crash): the
    failure is the delivery's, retried later by the schedule, not at once."""
    import http.client

    with raw_receiver(lambda number, served: (OK, False) if served == 1 else "drop") as rx:
        with transport.WebhookConnections() as connections:
            assert connections.post(target=rx.target(), body=b"first", headers={}).status == 200
            with pytest.raises(http.client.RemoteDisconnected):
                connections.post(target=rx.target(), body=b"second", headers={})
    assert rx.requests == [(1, b"first"), (1, b"second")]


def test_an_answer_with_no_length_on_a_connection_left_open_is_taken_after_a_silence(monkeypatch: Any) -> None:
    """HTTP/1.1 with no length and no close: it used to end when the receiver honoured our
    `Connection: close`. Its status is taken after UNFRAMED_IDLE_SECONDS, not a read timeout."""
    monkeypatch.setattr(transport, "UNFRAMED_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(transport, "READ_TIMEOUT_SECONDS", 5.0)
    unframed = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nreceived"
    with raw_receiver(lambda number, served: (unframed, False)) as rx:
        started = time.monotonic()
        with transport.WebhookConnections() as connections:
            answers = [connections.post(target=rx.target(), body=b"e%d" % n, headers={}) for n in range(2)]
        assert time.monotonic() - started < transport.READ_TIMEOUT_SECONDS  # not a read timeout each (10 s)
    assert [(a.status, a.excerpt) for a in answers] == [(200, "received")] * 2
    assert rx.connections == 2  # never reused: its end is unknown


def test_a_delivery_to_another_address_gets_a_new_connection() -> None:
    """The name resolved elsewhere (or another endpoint): the kept connection is closed, not used."""
    with raw_receiver(lambda number, served: (OK, False), host="0.0.0.0") as rx:  # 127.0.0.2 reaches it too
        elsewhere = Target(scheme="http", host="127.0.0.1", port=rx.port, path="/hook", address="127.0.0.2")
        with transport.WebhookConnections() as connections:
            connections.post(target=rx.target(), body=b"a", headers={})
            connections.post(target=elsewhere, body=b"b", headers={})
            connections.post(target=rx.target(), body=b"c", headers={})
    assert [number for number, _ in rx.requests] == [1, 2, 3]


def test_runs_send_on_kept_connections_and_close_them_once_idle(tenant: Tenant, loopback_http: None, monkeypatch: Any) -> None:
    """An endpoint capped at one request at a time gets a run's six deliveries on one
    connection, and the next run's on the same one; a run after the target sat idle past
    KEPT_IDLE_SECONDS closes it first and opens a new one."""
    merchant = MerchantFactory()
    with receiver_running() as rx:
        endpoint, _ = _endpoint(merchant, rx.url())
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(max_concurrency=1)
        events = [_event(merchant, n) for n in range(6)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 6
        assert sorted(rx.event_ids()) == sorted(e.id for e in events) and rx.connections == 1
        more = [_event(merchant, n) for n in range(6, 8)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 2  # the next run: the kept connection
        assert sorted(rx.event_ids()[6:]) == sorted(e.id for e in more) and rx.connections == 1 and rx.closed == 0
        monkeypatch.setattr(transport, "KEPT_IDLE_SECONDS", 0.0)
        last = [_event(merchant, 8)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 1  # idle past the limit: closed, a new one opened
        _until(lambda: rx.closed == 1)  # the receiver's handler saw the end of the first
        assert rx.connections == 2
    assert set(WebhookDelivery.objects.filter(event__in=events + more + last).values_list("status", flat=True)) == {"succeeded"}


def test_concurrent_requests_reuse_at_most_one_connection_each(tenant: Tenant, loopback_http: None) -> None:
    """40 deliveries at the default cap (8 at once): no more connections than the cap (a
    connection per request would be 40), none with more than 8 requests in flight, all
    closed once they are let go. (How many are in flight at one instant depends on the
    machine's load, so the connections are bounded by the cap, not by that peak.)"""
    merchant = MerchantFactory()
    with receiver_running(delay=0.02) as rx:
        _endpoint(merchant, rx.url())
        events = [_event(merchant, n) for n in range(40)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 40
        assert sorted(rx.event_ids()) == sorted(e.id for e in events)
        assert rx.connections <= 8 and rx.max_in_flight["/hook"] <= 8
        webhook_kept_connections_close()
        _until(lambda: rx.closed == rx.connections)


def _until(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)



# The documented receiver (devtools/webhook_receiver.py, which merchants copy), served for real.


@contextmanager
def doc_receiver_running(secret: str, handle: Any = None) -> Iterator[tuple[int, list[int], Any]]:
    """The documented receiver's handler on a free port; yields the port, a list with one
    entry per connection it accepted, and the module (its `handle_event` replaceable)."""
    from http.server import ThreadingHTTPServer

    from tests.receivers import doc_receiver

    module = doc_receiver()
    if handle is not None:
        module.handle_event = handle
    accepted: list[int] = []

    class Counting(module.make_handler([secret], module.Dedupe())):  # type: ignore[misc]
        def setup(self) -> None:
            super().setup()
            accepted.append(1)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], accepted, module
    finally:
        server.shutdown()
        server.server_close()


def _doc_endpoint(merchant: Any) -> tuple[Any, str]:
    """An endpoint (and its secret) whose URL is set once its receiver listens."""
    return _endpoint(merchant, "http://127.0.0.1:9/webhooks")


def _point(endpoint: Any, port: int) -> None:
    endpoint.url = f"http://127.0.0.1:{port}/webhooks"
    endpoint.save(update_fields=["url"])


def test_the_documented_receiver_takes_a_run_on_kept_connections(tenant: Tenant, loopback_http: None, capsys: Any) -> None:
    merchant = MerchantFactory()
    endpoint, secret = _doc_endpoint(merchant)
    endpoint.max_concurrency = 1  # one request at a time: one connection for the run
    endpoint.save(update_fields=["max_concurrency"])
    with doc_receiver_running(secret) as (port, accepted, _):
        _point(endpoint, port)
        events = [_event(merchant, n) for n in range(4)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 4
    assert set(WebhookDelivery.objects.filter(event__in=events).values_list("status", flat=True)) == {"succeeded"}
    assert len(accepted) == 1
    printed = capsys.readouterr().out
    assert all(e.id in printed for e in events)


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: -1", b"Content-Length: +5", b"Content-Length: 1_0", b"Content-Length: 5\r\nContent-Length: 7",
     b"Transfer-Encoding: chunked", b""],
    ids=["negative", "plus", "underscore", "twice", "chunked", "none"],
)
def test_the_documented_receiver_refuses_any_framing_but_one_length_and_closes(framing: bytes) -> None:
    with doc_receiver_running("whsec_x") as (port, _, _):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"POST /webhooks HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n\r\nhello")
            answer = b""
            while chunk := client.recv(65536):  # it closes: the read ends
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 411 ") and b"Connection: close" in answer


def test_the_documented_receiver_answers_500_when_its_handler_fails_and_handles_the_redelivery(
    tenant: Tenant, loopback_http: None
) -> None:
    handled: list[str] = []

    def fail_once(event: dict[str, Any]) -> None:
        if not handled:
            handled.append("failed " + event["id"])
            raise RuntimeError("database down")
        handled.append(event["id"])

    merchant = MerchantFactory()
    endpoint, secret = _doc_endpoint(merchant)
    with doc_receiver_running(secret, handle=fail_once) as (port, _, _):
        _point(endpoint, port)
        event = _event(merchant, 1)
        outbox_batch_publish()
        webhook_deliveries_dispatch()
        delivery = WebhookDelivery.objects.get(event=event, endpoint=endpoint)
        assert (delivery.status, delivery.last_status_code) == ("pending", 500)
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=delivery.created)  # due again now
        webhook_deliveries_dispatch()
    assert handled == [f"failed {event.id}", event.id]
    assert WebhookDelivery.objects.get(pk=delivery.pk).status == "succeeded"


def test_a_url_with_a_non_ascii_path_is_delivered_percent_encoded_and_stops_no_other_endpoint(
    tenant: Tenant, loopback_http: None
) -> None:
    """URLField takes `/höok`; the request line takes ASCII only. Sent raw, it raised out
    of the whole dispatch, and every endpoint after it got nothing. A `%` that starts no
    escape is encoded too; escapes stay as they are."""
    first, second, third = MerchantFactory(), MerchantFactory(), MerchantFactory()
    with receiver_running() as rx:
        _endpoint(first, rx.url("/h\u00f6ok?q=caf\u00e9 au lait"))
        _endpoint(second, rx.url("/ok"))
        _endpoint(third, rx.url("/100%/a%41%2f?off=50%"))
        _event(first, 1), _event(second, 2), _event(third, 3)
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 3
    assert sorted(r.path for r in rx.requests) == ["/100%25/a%41%2f?off=50%25", "/h%C3%B6ok?q=caf%C3%A9%20au%20lait", "/ok"]


def test_the_documented_receivers_dedupe_holds_a_redelivery_while_the_first_is_handled() -> None:
    """A handler slower than Tally's wait: the redelivery must not be answered 200 while the
    first may still fail (the event would be lost), nor handled twice at once."""
    from tests.receivers import doc_receiver

    dedupe = doc_receiver().Dedupe()
    assert dedupe.begin("evt_1") == "new"
    assert dedupe.begin("evt_1") == "busy"  # answered 409: delivered again later
    dedupe.end("evt_1", handled=False)  # the first failed
    assert dedupe.begin("evt_1") == "new"  # the next delivery handles it
    dedupe.end("evt_1", handled=True)
    assert dedupe.begin("evt_1") == "done"



def test_an_endpoint_whose_secret_cannot_be_read_holds_back_no_other(tenant: Tenant, loopback_http: None, monkeypatch: Any) -> None:
    """Signing happens after the batch is leased: one endpoint whose secret cannot be read
    (a key rotated away, a corrupt row) fails its own deliveries, recorded as attempts and
    retried on their schedule, and the batch's other deliveries go at once."""
    import webhooks.services.deliveries as deliveries
    from webhooks.models import WebhookDeliveryAttempt, WebhookDeliveryStatus

    broken_merchant, good_merchant = MerchantFactory(), MerchantFactory()
    with receiver_running() as broken_rx, receiver_running() as good_rx:
        broken, _ = _endpoint(broken_merchant, broken_rx.url())
        _endpoint(good_merchant, good_rx.url())
        readable = deliveries.webhook_endpoint_signing_secrets

        def secrets(*, endpoint: WebhookEndpoint) -> Any:
            if endpoint.pk == broken.pk:
                raise ValueError("cannot unseal")
            return readable(endpoint=endpoint)

        monkeypatch.setattr(deliveries, "webhook_endpoint_signing_secrets", secrets)
        bad = [_event(broken_merchant, n) for n in range(3)]
        good = [_event(good_merchant, n) for n in range(3, 6)]
        outbox_batch_publish()
        webhook_deliveries_dispatch()
        assert sorted(good_rx.event_ids()) == sorted(e.id for e in good)
        assert broken_rx.event_ids() == []
    failed = WebhookDelivery.objects.filter(event__in=bad)
    assert {d.status for d in failed} == {WebhookDeliveryStatus.PENDING}
    errors = set(WebhookDeliveryAttempt.objects.filter(delivery__in=failed).values_list("error", flat=True))
    assert errors == {"signing: ValueError"}


def test_a_connection_opens_no_socket_to_an_address_off_the_allow_list(settings: Any) -> None:
    """The checked address is checked again as a connection opens its socket: a target
    checked under other settings (or made by hand) does not reach loopback where it is
    not allowed."""
    from webhooks.errors import WebhookTargetRefused

    with raw_receiver(lambda number, served: (OK, False)) as rx:
        settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = False
        with transport.WebhookConnections() as connections, pytest.raises(WebhookTargetRefused):
            connections.post(target=rx.target(), body=b"event", headers={})
    assert rx.connections == 0 and rx.requests == []


def test_a_kept_connection_idle_past_the_limit_is_not_used_again(monkeypatch: Any) -> None:
    """A connection that sat idle longer than KEPT_IDLE_SECONDS is dropped when next wanted
    (the receiver may be closing it just then), even while its target stays busy."""
    monkeypatch.setattr(transport, "KEPT_IDLE_SECONDS", 0.2)
    with raw_receiver(lambda number, served: (OK, False)) as rx:
        assert _post_all(rx, 2) == [200] * 2  # back to back: one connection
        assert _post_all(rx, 2, pause=0.3) == [200] * 2  # idle 0.3 s between: a new one each
    assert [number for number, _ in rx.requests] == [1, 1, 2, 3]


def test_idle_targets_are_closed_by_the_process_without_a_run(tenant: Tenant, loopback_http: None, monkeypatch: Any) -> None:
    """A worker that gets no more relay runs still closes what it kept: the process's reaper
    closes a target idle past KEPT_IDLE_SECONDS (the receiver sees the end)."""
    from webhooks.services import deliveries

    monkeypatch.setattr(deliveries, "KEPT_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(transport, "KEPT_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(deliveries, "_SENDERS", deliveries._Senders())  # its reaper reads the short limit
    merchant = MerchantFactory()
    with receiver_running() as rx:
        _endpoint(merchant, rx.url())
        _event(merchant, 1)
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 1 and rx.connections == 1
        _until(lambda: rx.closed == 1, seconds=3.0)


def test_an_answer_carrying_a_nul_is_recorded_and_holds_back_no_other(tenant: Tenant, loopback_http: None) -> None:
    """PostgreSQL's text refuses NUL: an excerpt carrying one is stored with it replaced, and
    the round that records it records the others too (one failing would leave them all leased)."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nok\x00!"
    merchant = MerchantFactory()
    with raw_receiver(lambda number, served: (reply, False)) as rx:
        _endpoint(merchant, f"http://127.0.0.1:{rx.port}/hook")
        events = [_event(merchant, n) for n in range(3)]
        outbox_batch_publish()
        assert webhook_deliveries_dispatch() == 3
    deliveries = WebhookDelivery.objects.filter(event__in=events)
    assert set(deliveries.values_list("status", flat=True)) == {"succeeded"}
    assert set(WebhookDeliveryAttempt.objects.filter(delivery__in=deliveries).values_list("response_excerpt", flat=True)) == {"ok\ufffd!"}
