"""POSTs with http.client to the address webhooks.targets checked, never following
redirects (a 3xx is a failure), with short timeouts and a bounded read.

`WebhookConnections` keeps one connection alive between requests (HTTP/1.1 keep-alive),
reused only for the same scheme, address, port and host, while the receiver keeps it
open, its last answer was read whole and nothing readable has come since."""

from __future__ import annotations

import contextlib
import functools
import http.client
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from webhooks.targets import Target

CONNECT_TIMEOUT_SECONDS = 3.0
READ_TIMEOUT_SECONDS = 10.0
MAX_RESPONSE_BYTES = 4096  # read this much of the answer, at most; keep an excerpt
UNFRAMED_IDLE_SECONDS = 1.0  # an answer with no length: how long a silence ends it


@dataclass(frozen=True)
class Answer:
    status: int
    excerpt: str


def _socket_open(address: str, port: int) -> socket.socket:
    """A TCP connection without Nagle's algorithm, as http.client's own `connect` sets: it
    sends headers and body in two writes, and on a kept connection Nagle holds the body
    back for the receiver's delayed ACK, 40 ms a delivery on Linux."""
    sock = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_SECONDS)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(READ_TIMEOUT_SECONDS)
    except BaseException:
        sock.close()
        raise
    return sock


def _ack_promptly(sock: socket.socket | None) -> None:
    """ACK the answer's first segments at once (TCP_QUICKACK lapses, so it is set for each
    answer): a receiver that sends headers and body apart with Nagle on (Python's
    http.server) holds the body until the headers are ACKed, 40 ms a delivery."""
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


_TLS_CONTEXT_LOCK = threading.Lock()


@functools.cache
def _tls_context_built() -> ssl.SSLContext:
    """The process's TLS client context (system CA bundle, certificates and names verified),
    built once under _TLS_CONTEXT_LOCK, as loading the bundle costs 29 ms of CPU. Shared by
    every delivery and thread, so it must never be changed after it is built."""
    return ssl.create_default_context()


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to `host` (Host, SNI and certificate checked against the name), over a socket
    to the checked address."""

    def __init__(self, target: Target) -> None:
        with _TLS_CONTEXT_LOCK:
            self.tls_context = _tls_context_built()
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
    """A new connection, opened now; never reopened by http.client itself (`auto_open` off),
    so every socket goes to the checked address."""
    conn: http.client.HTTPConnection = _PinnedHTTPSConnection(target) if target.scheme == "https" else _PinnedHTTPConnection(target)
    conn.auto_open = 0
    try:
        conn.connect()
    except BaseException:
        conn.close()
        raise
    return conn


def _idle_and_clean(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept connection may carry the next request: nothing readable since its
    last answer (a close, or stray bytes that would read as the next answer), as urllib3
    checks a pooled connection."""
    sock = conn.sock
    if sock is None:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


def _answer_read(conn: http.client.HTTPConnection) -> tuple[Answer, bool]:
    """The answer to the request just sent; the flag says whether `conn` may carry another."""
    sock = conn.sock  # getresponse() drops it from `conn` when the answer will close it
    _ack_promptly(sock)
    response = conn.getresponse()
    if response.length is None and not response.chunked:
        data = _read_until_close(response, sock)
        return Answer(status=response.status, excerpt=data.decode("utf-8", errors="replace")[:500]), False
    data = response.read(MAX_RESPONSE_BYTES)
    # isclosed(): the whole answer was read; will_close: `Connection: close` or HTTP/1.0.
    reusable = not response.will_close and response.isclosed()
    return Answer(status=response.status, excerpt=data.decode("utf-8", errors="replace")[:500]), reusable


def _read_until_close(response: http.client.HTTPResponse, sock: socket.socket | None) -> bytes:
    """An answer with no length ends where the receiver closes the connection, or after
    UNFRAMED_IDLE_SECONDS of silence (one that never closes it); its status stands."""
    if sock is not None:
        sock.settimeout(UNFRAMED_IDLE_SECONDS)
    deadline = time.monotonic() + READ_TIMEOUT_SECONDS  # a trickle ends too
    chunks: list[bytes] = []
    size = 0
    while size < MAX_RESPONSE_BYTES and time.monotonic() < deadline:
        try:
            chunk = response.read1(MAX_RESPONSE_BYTES - size)
        except TimeoutError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


# A kept connection the receiver closed just after the idle check fails the write: the
# receiver never got the request, so it goes again on a new connection. Anything failing
# once the request went is the attempt's failure, retried by the schedule: the receiver
# may have taken it (a reset can follow a processed request).
_UNSENT = (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class _NotSent(Exception):
    """A request a kept connection failed to send (see _UNSENT)."""


class WebhookConnections:
    """One kept connection, for one sending thread at a time. Use as a context manager."""

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
        if current is not None:
            try:
                reusable = current[0] == key and _idle_and_clean(current[1])
            except BaseException:
                current[1].close()
                raise
            if reusable:
                try:
                    return self._exchange_on(current[1], key, target, body, headers, kept=True)
                except _NotSent:
                    pass  # closed by the receiver just after the check: on a new connection
            else:
                current[1].close()  # closed by the receiver, not clean, or another place
        self.opened += 1
        return self._exchange_on(_connect(target), key, target, body, headers, kept=False)

    def _exchange_on(
        self, conn: http.client.HTTPConnection, key: tuple[str, str, int, str], target: Target, body: bytes, headers: dict[str, str],
        *, kept: bool,
    ) -> Answer:
        sent = False
        try:
            conn.request("POST", target.path, body=body, headers={**headers, "Content-Length": str(len(body))})
            sent = True
            answer, reusable = _answer_read(conn)
        except BaseException as exc:
            conn.close()
            if kept and not sent and isinstance(exc, _UNSENT):
                raise _NotSent from exc
            raise
        if reusable:
            self._open = (key, conn)
        else:
            conn.close()
        return answer
