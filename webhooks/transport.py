"""POSTs over urllib3 to the address webhooks.targets checked (a pool per target URL and
checked address; a socket opens only to it, checked again), speaking HTTP and TLS to the
name; no redirect followed, short timeouts, a bounded read. When a connection is kept:
docs/WEBHOOKS.md "Where deliveries go"."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from urllib3 import BaseHTTPResponse, HTTPConnectionPool, HTTPSConnectionPool, PoolManager, Timeout
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ClosedPoolError, HTTPError, ReadTimeoutError
from urllib3.response import HTTPResponse
from urllib3.util.connection import create_connection

from webhooks.targets import Target, target_address_check

CONNECT_TIMEOUT_SECONDS = 3.0
READ_TIMEOUT_SECONDS = 10.0
MAX_RESPONSE_BYTES = 4096  # read this much of the answer, at most; keep an excerpt
UNFRAMED_IDLE_SECONDS = 1.0  # an answer with no length: how long a silence ends it
KEPT_TARGETS = 64  # target URLs with kept connections; the least recently used beyond are closed
# A kept connection idle this long is not used again (under the 5 s idle timeout common to
# servers, Apache's and Node's, so one is rarely closed by the receiver just as a request
# goes on it), and a target's close once none of them was used for this long.
KEPT_IDLE_SECONDS = 4.0

# What a failed POST raises: the socket, TLS or HTTP error (unwrapped from urllib3's), or a urllib3 error that wraps none.
SEND_ERRORS = (OSError, http.client.HTTPException, HTTPError)


@dataclass(frozen=True)
class Answer:
    status: int
    excerpt: str


def _ack_promptly(sock: socket.socket | None) -> None:
    """ACK the answer's first segments at once (TCP_QUICKACK lapses, so it is set for each
    answer): a receiver that sends headers and body apart with Nagle on (Python's
    http.server) holds the body until the headers are ACKed, 40 ms a delivery."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


_TLS_CONTEXT_LOCK = threading.Lock()


@functools.cache
def _tls_context_built() -> ssl.SSLContext:
    """The process's TLS client context, built once (under _TLS_CONTEXT_LOCK): loading the CA
    bundle costs 29 ms of CPU. Shared by every thread, so never changed once built (why the
    connection below wraps its socket itself: urllib3 sets ALPN on the context it is given)."""
    return ssl.create_default_context()


# A kept connection the receiver closed just after urllib3's idle check fails the write: never
# received, the request goes again on another connection. A failure once it went is the attempt's,
# retried by the schedule: the receiver may have taken it (a reset can follow a processed request).
_UNSENT = (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class _NotSent(Exception):
    """A request a kept connection failed to send (see _UNSENT). Not an OSError, so urllib3
    neither swallows it nor reads an answer after it."""


class _PinnedHTTPConnection(HTTPConnection):
    """HTTP to the target's name (Host), over a socket to its checked address."""

    def __init__(self, host: str, port: int | None = None, *, target: Target, on_open: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self.target, self.on_open = target, on_open
        self.answers = 0  # on the current socket: a request after one goes on a kept connection
        self.answered_at = 0.0  # when its last answer came (monotonic)

    def _new_conn(self) -> socket.socket:
        target_address_check(host=self.target.host, address=self.target.address)
        self.answers = 0
        self.on_open()
        return create_connection((self.target.address, self.port), self.timeout, socket_options=self.socket_options)

    @property
    def is_connected(self) -> bool:
        """urllib3's check (nothing readable on the socket: no close, no stray bytes that
        would read as the next answer), no TLS bytes decrypted but unread, which polling
        the socket does not see, and not idle past KEPT_IDLE_SECONDS (urllib3 then opens
        a new one)."""
        if self.answers and time.monotonic() - self.answered_at > KEPT_IDLE_SECONDS:
            return False
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False
        return super().is_connected

    def request(  # type: ignore[override]  # the rest of urllib3's keywords pass through
        self, method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        """The target's path as webhooks.targets wrote it (urllib3 would upper-case escapes)."""
        kept = self.sock is not None and self.answers > 0
        try:
            super().request(method, self.target.path, body=body, headers=headers, **kwargs)
        except _UNSENT as exc:
            if kept:
                raise _NotSent from exc
            raise

    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3's own
        sock = self.sock  # http.client drops it from the connection when the answer will close it
        _ack_promptly(sock)
        response = super().getresponse()
        self.answers += 1
        self.answered_at = time.monotonic()
        if response.length_remaining is None and not response.chunked and sock is not None:
            sock.settimeout(UNFRAMED_IDLE_SECONDS)  # it ends where the receiver closes, or falls silent
        return response


class _PinnedHTTPSConnection(_PinnedHTTPConnection, HTTPSConnection):
    """HTTPS to the target's name (Host, SNI, certificate) over a socket to its checked address."""

    def connect(self) -> None:
        with _TLS_CONTEXT_LOCK:
            context = _tls_context_built()
        raw = self._new_conn()
        try:
            self.sock = context.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
        self.is_verified = True  # the context verifies the certificate and its name


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class WebhookConnections(PoolManager):
    """Kept connections for sending threads, up to `per_target` per target URL, reused only
    for the address just checked; a target's closed by `idle_close` once unused for a while,
    all by `clear()` (or as a context manager)."""

    def __init__(self, *, per_target: int = 1) -> None:
        super().__init__(num_pools=KEPT_TARGETS, maxsize=per_target, on_open=self._opened)
        self.pools.dispose_func = HTTPConnectionPool.close  # a pool dropped is closed now, not when collected
        self.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
        self.key_fn_by_scheme = {"http": itemgetter("target"), "https": itemgetter("target")}  # type: ignore[dict-item]  # a pool per Target
        self._opened_lock = threading.Lock()
        self.opened = 0  # connections made, for the tests and benchmarks
        self._used: dict[Target, float] = {}  # target -> when a request to it last ended (monotonic)

    def _opened(self) -> None:
        with self._opened_lock:
            self.opened += 1

    def idle_close(self, *, idle_seconds: float | None = None) -> int:
        """Close the connections of every target none of whose was used in `idle_seconds`
        (KEPT_IDLE_SECONDS); return how many targets."""
        cutoff = time.monotonic() - (KEPT_IDLE_SECONDS if idle_seconds is None else idle_seconds)
        with self._opened_lock:
            idle = [target for target, used in self._used.items() if used <= cutoff]
        for target in idle:
            with contextlib.suppress(KeyError):  # gone already (the least recently used beyond KEPT_TARGETS)
                del self.pools[target]  # type: ignore[arg-type]  # our pools are keyed by Target (key_fn_by_scheme)
            with self._opened_lock:
                if self._used.get(target, cutoff + 1) <= cutoff:  # not used again meanwhile
                    del self._used[target]
        return len(idle)

    def clear(self) -> None:
        with self._opened_lock:
            self._used.clear()
        super().clear()

    def _new_pool(self, scheme: str, host: str, port: int, request_context: dict[str, Any] | None = None) -> HTTPConnectionPool:
        """A pool for a target new to the run (under the pools' lock); the same URL's pool for
        another address is closed: its connections go to an address not just checked."""
        assert request_context is not None  # always given by connection_from_pool_key
        target: Target = request_context["target"]
        for other in self.pools.keys():
            if isinstance(other, Target) and dataclasses.replace(other, address=target.address) == target:
                del self.pools[other]
        return super()._new_pool(scheme, host, port, request_context)

    def post(self, *, target: Target, body: bytes, headers: dict[str, str]) -> Answer:
        """POST `body`; return the status and an excerpt of the answer. Raises
        WebhookTargetRefused (an address off the allow-list) or one of SEND_ERRORS."""
        timeout = Timeout(connect=CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS)
        with self._opened_lock:
            self._used[target] = time.monotonic()  # in use: not idle while a slow answer comes
        try:
            while True:
                pool = self.connection_from_host(target.host, target.port, target.scheme, pool_kwargs={"target": target})
                try:
                    response = pool.urlopen(
                        "POST", target.path, body=body, headers=headers, retries=False, redirect=False, timeout=timeout,  # a 3xx is the answer
                        preload_content=False, decode_content=False,
                    )
                    break
                except (_NotSent, ClosedPoolError):  # never sent: again, on another connection
                    continue
            try:
                return _answer_read(response)
            finally:
                response.release_conn()
        except HTTPError as exc:
            raise _cause(exc) from None
        finally:
            with self._opened_lock:
                self._used[target] = time.monotonic()


def _answer_read(response: BaseHTTPResponse) -> Answer:
    """The answer's status and the start of its body; its connection is kept only if it was read whole."""
    data = _read_until_quiet(response) if response.length_remaining is None and not response.chunked else response.read(MAX_RESPONSE_BYTES)
    if not response.closed:  # more than MAX_RESPONSE_BYTES: never read as the next answer
        response.close()
    return Answer(status=response.status, excerpt=data.decode("utf-8", errors="replace")[:500])


def _read_until_quiet(response: BaseHTTPResponse) -> bytes:
    """An answer with no length ends where the receiver closes, or after UNFRAMED_IDLE_SECONDS of silence."""
    deadline = time.monotonic() + READ_TIMEOUT_SECONDS  # a trickle ends too
    data = bytearray()
    while len(data) < MAX_RESPONSE_BYTES and time.monotonic() < deadline:
        try:
            chunk = response.read1(MAX_RESPONSE_BYTES - len(data))
        except ReadTimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _cause(exc: BaseException) -> BaseException:
    """The socket, TLS or HTTP error under urllib3's wrappers (their cause, or an argument)."""
    while isinstance(exc, HTTPError):
        inner = exc.__cause__ or next((arg for arg in exc.args if isinstance(arg, BaseException)), None)
        if inner is None:
            break
        exc = inner
    return exc
