"""OpenAPI documentation of the faces: bearer auth, the error envelope on every
operation, and the Idempotency-Key header on every POST."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers


class ErrorBodySerializer(serializers.Serializer[Any]):
    type = serializers.CharField(help_text="e.g. invalid_request_error, authentication_error, payment_error, rate_limit_error, api_error")
    code = serializers.CharField()
    message = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    request_id = serializers.CharField()


class ErrorSerializer(serializers.Serializer[Any]):
    error = ErrorBodySerializer()


_ERROR_DESCRIPTIONS = {
    400: "Malformed or invalid input (`param` names the field); missing Idempotency-Key where required.",
    401: "Missing, unknown, revoked or expired API key.",
    402: "Business refusal: insufficient funds, cap exceeded, wallet frozen (stored and replayed).",
    403: "This key's principal type cannot use this face.",
    404: "Unknown object, or another principal's object.",
    405: "Method not allowed.",
    406: "Only application/json responses are available.",
    409: "Same Idempotency-Key still in flight, or the object's state does not allow this.",
    410: "Idempotency-Key past its replay window.",
    411: "The body was sent without a Content-Length (Transfer-Encoding: chunked): send it with one.",
    413: "Request body too large.",
    415: "Body is not application/json.",
    422: "Same Idempotency-Key used with a different request.",
    429: "Throttled (per key or per tenant); see Retry-After.",
    500: "Internal error (a bug: never the client's fault).",
    503: "A store is unavailable; retry after Retry-After.",
}
_READ_ERRORS = (400, 401, 403, 404, 406, 411, 429, 500, 503)
_WRITE_ERRORS = (400, 401, 402, 403, 404, 406, 409, 410, 411, 413, 415, 422, 429, 500, 503)

IDEMPOTENCY_KEY_PARAMETER = OpenApiParameter(
    name="Idempotency-Key",
    type=str,
    location=OpenApiParameter.HEADER,
    required=False,
    description=(
        "1 to 255 printable ASCII characters. Retrying with the same key returns the first "
        "response (byte-identical) without moving money again. Mandatory or optional per tenant and face."
    ),
)


class TallyAutoSchema(AutoSchema):
    def get_override_parameters(self) -> list[Any]:
        params = list(super().get_override_parameters())
        if self.method == "POST":
            params.append(IDEMPOTENCY_KEY_PARAMETER)
        return params

    def _is_list_view(self, serializer: Any = None) -> bool:
        # A face's `list` action answers its own documented envelope ({object, data,
        # next_cursor}: the *List serializers), never a bare array: drf-spectacular must not
        # wrap it in one, add DRF pagination or filter parameters, nor rename the operation.
        if self.path.startswith("/v1/") and getattr(self.view, "action", None) == "list":
            return False
        return bool(super()._is_list_view(serializer))

    def get_tags(self) -> list[str]:
        parts = [p for p in self.path.split("/") if p and not p.startswith("{")]
        return [parts[1]] if len(parts) > 1 and parts[0] == "v1" else super().get_tags()

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)  # type: ignore[arg-type]
        if not self.path.startswith("/v1/"):
            return responses
        codes = _WRITE_ERRORS if self.method in {"POST", "PATCH", "PUT", "DELETE"} else _READ_ERRORS
        for code in codes:
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(  # type: ignore[no-untyped-call]
                    OpenApiResponse(response=ErrorSerializer, description=_ERROR_DESCRIPTIONS[code]), str(code), direction=direction
                )
        return responses


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "payments.api.auth.ApiKeyAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "API key with its type prefix: ck_ customer, tk_ terminal, sk_ merchant, ak_ staff.",
        }
