"""OpenAPI documentation of the faces: bearer auth, the error envelope on every
operation, and the Idempotency-Key header on every POST."""

from __future__ import annotations

import re
from typing import Any

from django.db import connection
from django_tenants.utils import get_public_schema_name
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from apikit.base import StrictSerializer
from apikit.fields import ASSET_CODE_RE, NON_BLANK_TEXT_PATTERN, TEXT_PATTERN, ConstField
from idempotency.canonical import KEY_MAX_LENGTH, KEY_PATTERN
from tenants.models import IdempotencyMode
from wallets.selectors import asset_codes_list


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
    414: "Request line too long (answered by the server before the application).",
    415: "Body is not application/json.",
    422: "Same Idempotency-Key used with a different request.",
    429: "Throttled (per key or per tenant); see Retry-After.",
    431: "Too many headers, or a header too large (answered by the server before the application).",
    500: "Internal error (a bug: never the client's fault).",
    503: "A store is unavailable; retry after Retry-After.",
}
# A GET's body is read and limited like a POST's (411, 413), though it means nothing.
_READ_ERRORS = (400, 401, 403, 404, 406, 411, 413, 414, 429, 431, 500, 503)
_WRITE_ERRORS = (400, 401, 402, 403, 404, 406, 409, 410, 411, 413, 414, 415, 422, 429, 431, 500, 503)
FACES = ("customer", "terminal", "merchant", "admin")


def idempotency_key_parameter(face: str) -> OpenApiParameter:
    """The Idempotency-Key header as the tenant being served takes it on `face` (SPEC 6).
    Generated anywhere but a tenant's host (the platform host, the tests), it is mandatory."""
    tenant = getattr(connection, "tenant", None)
    required = getattr(tenant, f"idempotency_{face}", IdempotencyMode.MANDATORY) != IdempotencyMode.OPTIONAL
    mode = "Mandatory on this face: 400 `idempotency_key_missing` without it." if required else (
        "Optional on this face for now (staged rollout): without it the request runs unprotected."
    )
    return OpenApiParameter(
        name="Idempotency-Key",
        type={"type": "string", "pattern": f"^{KEY_PATTERN}$", "minLength": 1, "maxLength": KEY_MAX_LENGTH},
        location=OpenApiParameter.HEADER,
        required=required,
        description=(
            "1 to 255 printable ASCII characters, not starting or ending with a space (HTTP strips those). "
            "Retrying with the same key returns the first response (byte-identical) without moving money again. " + mode
        ),
    )


class TallyAutoSchema(AutoSchema):
    def get_override_parameters(self) -> list[Any]:
        params = list(super().get_override_parameters())
        parts = self.path.split("/")
        if self.method == "POST" and len(parts) > 2 and parts[1] == "v1" and parts[2] in FACES:
            params.append(idempotency_key_parameter(parts[2]))
        return params

    def _is_list_view(self, serializer: Any = None) -> bool:
        # A face's `list` answers its own documented envelope (the *List serializers): no
        # array wrapping, DRF pagination or filter parameters, nor renaming.
        if self.path.startswith("/v1/") and getattr(self.view, "action", None) == "list":
            return False
        return bool(super()._is_list_view(serializer))

    def get_operation_id(self) -> str:
        # `<face>_<resource>_<action>`: unique without numeral suffixes (method-based naming
        # cannot tell a list from a retrieve once lists are not arrays).
        action = getattr(self.view, "action", None)
        if self.path.startswith("/v1/") and isinstance(action, str):
            tokens = [t.replace("-", "_") for t in self._tokenize_path()]
            return "_".join(tokens if tokens[-1:] == [action] else [*tokens, action])
        return str(super().get_operation_id())

    def get_description(self) -> str:  # type: ignore[override]  # drf-spectacular's signature, not DRF's
        # Not the view's docstring, written for developers: only what `extend_schema` says.
        if self.path.startswith("/v1/"):
            return ""
        return str(super().get_description())

    def get_tags(self) -> list[str]:
        parts = [p for p in self.path.split("/") if p and not p.startswith("{")]
        return [parts[1]] if len(parts) > 1 and parts[0] == "v1" else super().get_tags()

    def _map_basic_serializer(self, serializer: Any, direction: str) -> dict[str, Any]:
        # A strict request body refuses unknown fields (400 `parameter_unknown`): say so.
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)  # type: ignore[no-untyped-call]
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
            # Two fields of which exactly one must be given (e.g. customer or merchant).
            pair = getattr(serializer, "exactly_one_of", None)
            if pair:
                schema["oneOf"] = [{"required": [name]} for name in pair]
        return schema

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


class ConstFieldSchema(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    target_class = ConstField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "string", "enum": [self.target.value]}


class TextFieldSchema(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    target_class = "apikit.fields.TextField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["pattern"] = TEXT_PATTERN if self.target.allow_blank else NON_BLANK_TEXT_PATTERN
        return schema


class AssetFieldSchema(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    """On a tenant's host the asset codes are that tenant's, listed; elsewhere, their pattern."""

    target_class = "apikit.fields.AssetField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        field = self.target
        schema: dict[str, Any] = {"type": "string", "pattern": ASSET_CODE_RE.pattern, "maxLength": 12, "description": str(field.help_text or "")}
        tenant = getattr(connection, "tenant", None)
        if tenant is not None and getattr(tenant, "schema_name", "public") != get_public_schema_name():
            schema["enum"] = asset_codes_list(kinds=field.kinds)
        if field.allow_null:
            schema["nullable"] = True
        return schema


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "apikit.auth.ApiKeyAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "API key with its type prefix: ck_ customer, tk_ terminal, sk_ merchant, ak_ staff.",
        }


_ID_PATTERN_START = re.compile(r"\^[a-z?|()]{2,12}_\[")  # ^cus_[..., ^wh?d_[...


def _names_another_object(operation: dict[str, Any], schemas: dict[str, Any]) -> bool:
    """Whether the operation's body must name another object (an id with its type prefix):
    a link carries only the item's id, so following it would ask for an unknown object."""
    ref = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
    body = schemas.get(ref.rsplit("/", 1)[-1], {}) if ref else {}
    patterns = [str(body.get("properties", {}).get(name, {}).get("pattern", "")) for name in body.get("required", [])]
    return any(_ID_PATTERN_START.match(pattern) for pattern in patterns)


def _links_for(paths: dict[str, Any], source: str, pointer: str, schemas: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI links from `source` (a collection path) to the operations of its items."""
    prefix = source + "/{"
    links: dict[str, Any] = {}
    for path, operations in paths.items():
        if not path.startswith(prefix):
            continue
        parameter = path[len(prefix) : path.index("}", len(prefix))]
        for operation in operations.values():
            if isinstance(operation, dict) and "operationId" in operation and not _names_another_object(operation, schemas):
                links[operation["operationId"]] = {"operationId": operation["operationId"], "parameters": {parameter: pointer}}
    return links


def links_add(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: link each collection's create (201) and list
    (200) answers to the operations on the item they return, so a client, or schemathesis's
    stateful phase, can follow `id` from one call into the next."""
    paths: dict[str, Any] = result.get("paths", {})
    schemas: dict[str, Any] = result.get("components", {}).get("schemas", {})
    for path, operations in paths.items():
        if "{" in path:
            continue
        for method, pointer, status in (("post", "$response.body#/id", "201"), ("get", "$response.body#/data/0/id", "200")):
            response = operations.get(method, {}).get("responses", {}).get(status)
            links = _links_for(paths, path, pointer, schemas)
            if response is not None and links:
                response["links"] = links
    return result
