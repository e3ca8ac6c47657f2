"""A gunicorn worker whose own error answers are the SPEC 5 envelope, not HTML.

gunicorn answers some requests before Django sees them: a request line over
`limit_request_line` (414), too many or too large headers (431), bad header bytes,
`Content-Length` together with `Transfer-Encoding`, a malformed chunk (400), an unknown
transfer coding (501). Stock gunicorn writes those as an HTML page with no `Request-Id`.
This worker keeps gunicorn's choice of status and replaces only the bytes it writes.
"""

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
        # `Worker.handle_error` calls `util.write_error` by module attribute; this process
        # only ever runs this worker, so the replacement stays within it.
        util.write_error = _write_envelope_error
        super().init_process()


class NoAccessLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger without its access log unless one is asked for. Django already
    logs one JSON line per request (config.observability.MetricsMiddleware); gunicorn
    counts its access log as on whenever `logconfig_dict` is set, as ours is for JSON error
    lines, and then worked out every access-log field of every request only for the record
    to go nowhere: about 1% of a worker's CPU.
    An access log named explicitly (`--access-logfile`) is still written."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)
