"""POSTs to a checked webhook target (webhooks.targets): the standard library's
http.client, connected to the address that was checked, never following redirects (a
3xx is an answer, and a failure), with short timeouts and a bounded read.

A drain's deliveries to one endpoint share a connection (`WebhookConnections`): HTTP/1.1
keep-alive, as a browser or urllib3 does, instead of a TCP (and for https a TLS)
handshake per event on both sides. A connection is reused only for the same scheme,
checked address, port and host, only while the receiver keeps it open and only when its
answer was read whole, and never beyond the drain that opened it."""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import ssl
from dataclasses import dataclass

from webhooks.targets import Target

CONNECT_TIMEOUT_SECONDS = 3.0
READ_TIMEOUT_SECONDS = 10.0
MAX_RESPONSE_BYTES = 4096  # read this much of the answer, at most; keep an excerpt


@dataclass(frozen=True)
class Answer:
    status: int
    excerpt: str


def _socket_open(address: str, port: int) -> socket.socket:
    """A TCP connection with the timeouts, and without Nagle's algorithm, as http.client's
    own `connect` sets: http.client sends a request's headers and body in two writes, and
    on a kept connection Nagle holds the body back until the receiver's delayed ACK of the
    headers, 40 ms a delivery on Linux (bench_relay_cpu.py: 85 ms an event without this
    and `_ack_promptly`, 43 ms without this alone)."""
    sock = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_SECONDS)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(READ_TIMEOUT_SECONDS)
    except BaseException:
        sock.close()
        raise
    return sock


def _ack_promptly(sock: socket.socket | None) -> None:
    """ACK the answer's first segments at once (Linux's TCP_QUICKACK, which lapses by
    itself, so it is set for each answer). A receiver that writes its headers and body in
    two sends with Nagle's algorithm on (Python's http.server does) holds the body back
    until the headers are ACKed; on a kept connection, with delayed ACKs, that is 40 ms a
    delivery (bench_relay_cpu.py: 43 ms an event, 0.8 ms with this)."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to `host` (Host header), over a socket to the checked address."""

    def __init__(self, target: Target) -> None:
        super().__init__(target.host, target.port, timeout=READ_TIMEOUT_SECONDS)
        self.pinned_address = target.address

    def connect(self) -> None:
        self.sock = _socket_open(self.pinned_address, self.port)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The process's TLS client context: the system's CA bundle, certificates and names
    verified (`ssl.create_default_context`). One per process: building it loads the CA
    bundle, 29 ms of CPU on the benchmark machine, which every HTTPS delivery used to pay.
    An SSLContext serves any number of connections, from any thread; shared by every
    delivery, it must never be changed after it is built (verify mode, trust, ALPN).
    A changed CA bundle on disk is read when the worker restarts."""
    return ssl.create_default_context()


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to `host` (Host, SNI and certificate checked against the name), over a socket
    to the checked address."""

    def __init__(self, target: Target) -> None:
        self.tls_context = _tls_context()
        super().__init__(target.host, target.port, timeout=READ_TIMEOUT_SECONDS, context=self.tls_context)
        self.pinned_address = target.address

    def connect(self) -> None:
        raw = _socket_open(self.pinned_address, self.port)
        try:
            self.sock = self.tls_context.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def _connect(target: Target) -> http.client.HTTPConnection:
    return _PinnedHTTPSConnection(target) if target.scheme == "https" else _PinnedHTTPConnection(target)


def _exchange(conn: http.client.HTTPConnection, target: Target, body: bytes, headers: dict[str, str]) -> tuple[Answer, bool]:
    """One request and its answer; the flag says whether `conn` may carry another."""
    conn.request("POST", target.path, body=body, headers={**headers, "Content-Length": str(len(body))})
    _ack_promptly(conn.sock)
    response = conn.getresponse()
    data = response.read(MAX_RESPONSE_BYTES)
    # isclosed(): the whole answer was read (a longer one is left unread, and its connection
    # with it); will_close: the receiver said `Connection: close`, answered in HTTP/1.0 or
    # framed no length (http.client then closes the connection itself, and would open a new
    # one on the next request, unpinned from this check and uncounted).
    reusable = not response.will_close and response.isclosed()
    return Answer(status=response.status, excerpt=data.decode("utf-8", errors="replace")[:500]), reusable


# What a receiver that closed a kept connection while it sat idle looks like on the next
# request: the request never reached it (or, if it did, it went unanswered, and webhooks
# are at least once: receivers dedupe by event id). Sent again once on a new connection.
# A timeout is not among them: a slow receiver must not cost two.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class WebhookConnections:
    """The open connection of a drain (at most one: a drain sends to one endpoint). Use as a
    context manager; closing it closes the connection. One thread at a time."""

    def __init__(self) -> None:
        self._open: tuple[tuple[str, str, int, str], http.client.HTTPConnection] | None = None
        self.opened = 0  # connections made, for the tests and benchmarks

    def __enter__(self) -> WebhookConnections:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def post(self, *, target: Target, body: bytes, headers: dict[str, str]) -> Answer:
        """POST `body`; return the status and an excerpt of the answer. Raises OSError
        (refused, timeout, TLS) or http.client.HTTPException (garbled answer)."""
        key = (target.scheme, target.address, target.port, target.host)
        current, self._open = self._open, None
        if current is not None and current[0] == key:
            try:
                return self._post_on(current[1], key, target, body, headers)
            except _STALE:
                pass  # closed while idle: once more on a new connection
        elif current is not None:
            current[1].close()  # another place (the name now resolves elsewhere)
        self.opened += 1
        return self._post_on(_connect(target), key, target, body, headers)

    def _post_on(
        self, conn: http.client.HTTPConnection, key: tuple[str, str, int, str], target: Target, body: bytes, headers: dict[str, str]
    ) -> Answer:
        try:
            answer, reusable = _exchange(conn, target, body, headers)
        except BaseException:
            conn.close()
            raise
        if reusable:
            self._open = (key, conn)
        else:
            conn.close()
        return answer
