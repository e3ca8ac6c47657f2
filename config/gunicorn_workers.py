"""A gunicorn worker whose own error answers (414, 431, malformed requests, ...) are the
SPEC 5 envelope with a `Request-Id`, not gunicorn's HTML page; gunicorn's status stays."""

from __future__ import annotations

import json
import socket
from typing import Any

from gunicorn import util
from gunicorn.glogging import Logger
from gunicorn.workers.sync import SyncWorker

from config.observability import new_request_id

# gunicorn's own message can quote the offending bytes; the answer names the class only.
_ERROR_BY_STATUS: dict[int, tuple[str, str, str]] = {
    400: ("invalid_request_error", "request_malformed", "The request line, a header or the body framing is malformed."),
    403: ("invalid_request_error", "request_forbidden", "The request was refused before it reached the application."),
    414: ("invalid_request_error", "request_uri_too_long", "The request line is too long."),
    417: ("invalid_request_error", "expectation_failed", "The Expect header cannot be met."),
    431: ("invalid_request_error", "request_headers_too_large", "Too many headers, or a header is too large."),
    501: ("invalid_request_error", "transfer_coding_unsupported", "The transfer coding is not supported."),
}
_INTERNAL = ("api_error", "internal_error", "An internal error occurred.")


def envelope_error_bytes(status_int: int, reason: str) -> bytes:
    """The whole HTTP response gunicorn sends for an error it answers itself."""
    from apikit.errors import envelope  # Django is set up once the worker has loaded the app

    request_id = new_request_id()
    error_type, code, message = _ERROR_BY_STATUS.get(status_int, _INTERNAL)
    body = json.dumps(
        envelope(error_type=error_type, code=code, message=message, param=None, request_id=request_id), separators=(",", ":")
    ).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        "Cache-Control: no-store\r\n"
        f"Request-Id: {request_id}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _write_envelope_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    util.write_nonblock(sock, envelope_error_bytes(status_int, reason))


class EnvelopeSyncWorker(SyncWorker):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's sync worker, answering its own errors in the envelope."""

    def init_process(self) -> None:
        # `Worker.handle_error` calls `util.write_error` by module attribute; this process runs only this worker.
        util.write_error = _write_envelope_error
        super().init_process()


class NoAccessLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger without its access log unless one is named (`--access-logfile`).
    Django logs one JSON line per request; with `logconfig_dict` set, gunicorn built every
    access-log record only for it to go nowhere (about 1% of a worker's CPU)."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)
