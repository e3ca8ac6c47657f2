"""Request ids, structured-log context, request metrics, and the base of config's middleware."""

from __future__ import annotations

import contextvars
import logging
import re
import secrets
import time
from collections.abc import Callable

from django.db import connection
from django.http import HttpRequest, HttpResponse

from config import metrics

request_logger = logging.getLogger("tally.request")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
client_request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("client_request_id", default="-")
FACES = {"customer", "terminal", "merchant", "admin"}
_INCOMING_ID = re.compile(r"^[A-Za-z0-9_\-]{8,64}$")


def new_request_id() -> str:
    return "req_" + secrets.token_urlsafe(18)


class Middleware:
    """Django's middleware shape: called with each request, it calls the next handler."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response


class LogContextFilter(logging.Filter):
    """Adds the request id and tenant schema to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.client_request_id = client_request_id_var.get()
        record.tenant = getattr(connection, "schema_name", "-")
        return True


class RequestIdMiddleware(Middleware):
    """Every request gets an id of ours: a client's `X-Request-Id` is only kept beside it
    (logged, echoed as `Client-Request-Id`), so an id can be trusted in an incident. /v1/
    answers are `Cache-Control: no-store`: some carry a secret shown once."""

    def __call__(self, request: HttpRequest) -> HttpResponse:
        rid = new_request_id()
        incoming = request.headers.get("X-Request-Id", "")
        client_rid = incoming if _INCOMING_ID.match(incoming) else ""
        request.request_id = rid  # type: ignore[attr-defined]
        request.client_request_id = client_rid  # type: ignore[attr-defined]
        token = request_id_var.set(rid)
        client_token = client_request_id_var.set(client_rid or "-")
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
            client_request_id_var.reset(client_token)
        response["Request-Id"] = rid
        if client_rid:
            response["Client-Request-Id"] = client_rid
        if request.path.startswith("/v1/") or request.path == "/v1":
            response["Cache-Control"] = "no-store"
        return response


class MetricsMiddleware(Middleware):
    """Counts requests by face, method and status; runs after the tenant is resolved."""

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        parts = request.path.split("/")
        face = parts[2] if len(parts) > 2 and parts[1] == "v1" and parts[2] in FACES else "other"
        elapsed = time.perf_counter() - started
        metrics.REQUESTS.labels(face=face, method=request.method, status=str(response.status_code)).inc()
        metrics.REQUEST_SECONDS.labels(face=face).observe(elapsed)
        # One line per request; never headers or bodies (keys, tokens, PINs live there).
        request_logger.info(
            "request",
            extra={"method": request.method, "path": request.path, "status": response.status_code,
                   "duration_ms": round(elapsed * 1000, 2), "face": face},
        )
        return response
