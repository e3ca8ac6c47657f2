"""One POST to a checked webhook target (webhooks.targets): the standard library's
http.client, connected to the address that was checked, never following redirects (a
3xx is an answer, and a failure), with short timeouts and a bounded read."""

from __future__ import annotations

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


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to `host` (Host header), over a socket to the checked address."""

    def __init__(self, target: Target) -> None:
        super().__init__(target.host, target.port, timeout=READ_TIMEOUT_SECONDS)
        self.pinned_address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.pinned_address, self.port), timeout=CONNECT_TIMEOUT_SECONDS)
        self.sock.settimeout(READ_TIMEOUT_SECONDS)


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
        raw = socket.create_connection((self.pinned_address, self.port), timeout=CONNECT_TIMEOUT_SECONDS)
        raw.settimeout(READ_TIMEOUT_SECONDS)
        try:
            self.sock = self.tls_context.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def webhook_post(*, target: Target, body: bytes, headers: dict[str, str]) -> Answer:
    """POST `body`; return the status and an excerpt of the answer. Raises OSError (refused,
    timeout, TLS) or http.client.HTTPException (garbled answer)."""
    conn: http.client.HTTPConnection = _PinnedHTTPSConnection(target) if target.scheme == "https" else _PinnedHTTPConnection(target)
    try:
        conn.request("POST", target.path, body=body, headers={**headers, "Content-Length": str(len(body)), "Connection": "close"})
        response = conn.getresponse()
        data = response.read(MAX_RESPONSE_BYTES)
        return Answer(status=response.status, excerpt=data.decode("utf-8", errors="replace")[:500])
    finally:
        conn.close()
