"""The one place that turns a failure into the SPEC 5 error envelope and decides the HTTP
status of a domain error (`http_status_of`). Every face's view routes exceptions here; the
Django error handlers answer the same envelope for /v1/ paths that never reach a view."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults as django_defaults
from rest_framework import exceptions as drf
from rest_framework.response import Response

from idempotency.errors import IdempotencyErrorCode
from wallets import metrics
from wallets.errors import BusinessRefusal, Conflict, InvalidState, NotFound, NotPermitted, TallyError, Unavailable
from wallets.transactions import is_connection_failure

logger = logging.getLogger("tally.api")

RETRY_AFTER_SECONDS_DEFAULT = 1


class PayloadTooLarge(drf.APIException):
    status_code = 413
    default_detail = "request body too large"
    default_code = "request_too_large"


class LengthRequired(drf.APIException):
    status_code = 411
    default_detail = "send the body with a Content-Length header; chunked request bodies are not accepted"
    default_code = "length_required"


class BodyIncomplete(drf.APIException):
    status_code = 400
    default_detail = "the request body is shorter than its Content-Length"
    default_code = "request_body_incomplete"


def _request_id(request: Any) -> str:
    rid = getattr(request, "request_id", None) or getattr(getattr(request, "_request", None), "request_id", None)
    return str(rid or "-")


def envelope(*, error_type: str, code: str, message: str, param: str | None, request_id: str) -> dict[str, Any]:
    """The SPEC 5 error body; built here and nowhere else."""
    return {"error": {"type": error_type, "code": code, "message": message, "param": param, "request_id": request_id}}


# Codes whose status differs from their family's (SPEC 5: 410 expired key, 422 reused key).
_STATUS_BY_CODE: dict[str, tuple[int, str]] = {
    IdempotencyErrorCode.KEY_EXPIRED: (410, "idempotency_error"),
    IdempotencyErrorCode.KEY_REUSED: (422, "idempotency_error"),
    IdempotencyErrorCode.KEY_IN_USE: (409, "idempotency_error"),
}
# Families, most specific first; anything else a TallyError is a 400.
_STATUS_BY_FAMILY: tuple[tuple[type[TallyError], int, str], ...] = (
    (NotFound, 404, "invalid_request_error"),
    (NotPermitted, 403, "permission_error"),
    (BusinessRefusal, 402, "payment_error"),
    (Conflict, 409, "api_error"),
    (InvalidState, 409, "invalid_request_error"),
    (Unavailable, 503, "api_error"),
)


def http_status_of(exc: TallyError) -> tuple[int, str]:
    """(HTTP status, envelope type) of a domain error."""
    by_code = _STATUS_BY_CODE.get(str(exc.code))
    if by_code is not None:
        return by_code
    for family, status, error_type in _STATUS_BY_FAMILY:
        if isinstance(exc, family):
            return status, error_type
    return 400, "invalid_request_error"


def _first_validation_error(detail: Any, path: str = "") -> tuple[str | None, str, str]:
    """(param, message, code) of the first leaf of a DRF validation tree: a flat envelope
    like Stripe's. Nested fields are dotted (`metadata.key`), list items indexed (`items.0`)."""
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            if key in ("non_field_errors", "__all__"):
                _, message, code = _first_validation_error(value, path)
                return (path or None), message, code
            return _first_validation_error(value, f"{path}.{key}" if path else str(key))
        return (path or None), "invalid request", "parameter_invalid"
    if isinstance(detail, Sequence) and not isinstance(detail, str):
        for index, value in enumerate(detail):
            if isinstance(value, Mapping | list):
                return _first_validation_error(value, f"{path}.{index}" if path else str(index))
            return _first_validation_error(value, path)
        return (path or None), "invalid request", "parameter_invalid"
    code = str(getattr(detail, "code", None) or "invalid")
    if code == "required":
        code = "parameter_missing"
    elif code not in {"amount_invalid", "asset_unknown", "cursor_invalid", "parameter_unknown"}:
        code = "parameter_invalid"
    return (path or None), str(detail), code


_DRF_CODES: dict[type[drf.APIException], tuple[str, str]] = {
    drf.ParseError: ("invalid_request_error", "json_invalid"),
    drf.NotAuthenticated: ("authentication_error", "api_key_missing"),
    drf.AuthenticationFailed: ("authentication_error", "api_key_invalid"),
    drf.PermissionDenied: ("permission_error", "permission_denied"),
    drf.NotFound: ("invalid_request_error", "resource_missing"),
    drf.MethodNotAllowed: ("invalid_request_error", "method_not_allowed"),
    drf.NotAcceptable: ("invalid_request_error", "not_acceptable"),
    drf.UnsupportedMediaType: ("invalid_request_error", "unsupported_media_type"),
    drf.Throttled: ("rate_limit_error", "rate_limited"),
}  # any other: ("invalid_request_error", its default_code)


def _describe(exc: BaseException) -> tuple[int, str, str, str, str | None, dict[str, str]]:
    """(status, type, code, message, param, headers) for any exception a view may raise."""
    headers: dict[str, str] = {}
    if isinstance(exc, TallyError):
        if exc.retryable:
            headers["Retry-After"] = str(exc.retry_after_seconds)
        status, error_type = http_status_of(exc)
        return status, error_type, str(exc.code), exc.message, exc.param, headers
    if isinstance(exc, DatabaseError) and is_connection_failure(exc):
        # Fail closed (SPEC 5): the client may retry; nothing was decided.
        metrics.FAIL_CLOSED.labels(store="postgres").inc()
        headers["Retry-After"] = str(RETRY_AFTER_SECONDS_DEFAULT)
        return 503, "api_error", "unavailable", "database unavailable", None, headers
    if isinstance(exc, RequestDataTooBig):
        return 413, "invalid_request_error", "request_too_large", "request body too large", None, headers
    if isinstance(exc, Http404):
        return 404, "invalid_request_error", "resource_missing", "no such object", None, headers
    if isinstance(exc, DjangoPermissionDenied):
        return 403, "permission_error", "permission_denied", "permission denied", None, headers
    if isinstance(exc, SuspiciousOperation):
        return 400, "invalid_request_error", "request_invalid", "the request could not be processed", None, headers
    if isinstance(exc, drf.ValidationError):
        param, message, code = _first_validation_error(exc.detail)
        return 400, "invalid_request_error", code, message, param, headers
    if isinstance(exc, drf.APIException):
        error_type, code = next((v for k, v in _DRF_CODES.items() if isinstance(exc, k)), ("invalid_request_error", str(exc.default_code)))
        detail = exc.detail
        message = str(detail) if not isinstance(detail, Mapping | list) else str(exc.default_detail)
        if isinstance(exc, drf.Throttled):
            headers["Retry-After"] = str(max(1, math.ceil(getattr(exc, "wait", None) or RETRY_AFTER_SECONDS_DEFAULT)))
            message = "too many requests: retry later"
        if isinstance(exc, drf.AuthenticationFailed | drf.NotAuthenticated):
            headers["WWW-Authenticate"] = 'Bearer realm="tally"'
        return int(exc.status_code), error_type, code, message, None, headers
    raise exc


def _answer(request: Any, exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, envelope, headers) of `exc`; an unexpected crash still answers the envelope, never a stack."""
    try:
        status, error_type, code, message, param, headers = _describe(exc)
    except Exception:
        logger.exception("unhandled error in API view")
        status, error_type, code, message, param, headers = 500, "api_error", "internal_error", "internal error", None, {}
    return status, envelope(error_type=error_type, code=code, message=message, param=param, request_id=_request_id(request)), headers


def api_exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response | None:
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every error of every face, one envelope."""
    status, body, headers = _answer(context.get("request"), exc)
    return Response(body, status=status, headers=headers)


def error_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """A plain Django response in the envelope, for code that runs outside DRF views."""
    status, body, headers = _answer(request, exc)
    return JsonResponse(body, status=status, headers=headers)


def is_api_path(request: HttpRequest) -> bool:
    return request.path.startswith("/v1/") or request.path == "/v1"


def internal_error_response(request: HttpRequest) -> HttpResponse:
    body = envelope(error_type="api_error", code="internal_error", message="internal error", param=None, request_id=_request_id(request))
    return JsonResponse(body, status=500)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request):
        return error_response(request, Http404())
    return django_defaults.page_not_found(request, exception or Http404())


def handler500(request: HttpRequest) -> HttpResponse:
    if is_api_path(request):
        return internal_error_response(request)
    return django_defaults.server_error(request)


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request):
        return error_response(request, exception if isinstance(exception, BaseException) else SuspiciousOperation())
    return django_defaults.bad_request(request, exception or SuspiciousOperation())


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request):
        return error_response(request, DjangoPermissionDenied())
    return django_defaults.permission_denied(request, exception or DjangoPermissionDenied())
