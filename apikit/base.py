"""The base viewset every face inherits: auth, face gate, throttles, strict JSON, body
limit, and the single plug-in point of the idempotency mechanism (SPEC 6)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.db.models import QuerySet
from rest_framework import serializers, viewsets
from rest_framework.metadata import SimpleMetadata
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.auth import ApiKeyAuthentication, FacePermission, StaffRolePermission, api_key_cache_confirm
from apikit.errors import BodyIncomplete, LengthRequired, PayloadTooLarge
from apikit.idempotency import IdempotencyMixin
from apikit.pagination import CursorPagination
from apikit.parsers import StrictJSONParser
from apikit.principal import Principal
from apikit.shapes import Serializer
from apikit.throttling import KeyAndTenantThrottle, api_key_epoch_now
from wallets.models import Customer, StaffMember, Terminal

S = TypeVar("S", bound=serializers.Serializer[Any])


class StrictSerializer(Serializer):
    """Refuses unknown fields (a typo in a money request must fail loudly, not be ignored)
    and non-string values for text fields (DRF would turn 0 into "0")."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({str(unknown[0])[:64]: [serializers.ErrorDetail("unknown parameter", code="parameter_unknown")]})
            for name, field in self.fields.items():
                value = data.get(name)
                if isinstance(field, serializers.CharField) and name in data and value is not None and not isinstance(value, str):
                    raise serializers.ValidationError({name: [serializers.ErrorDetail("must be a string", code="invalid")]})
        return super().to_internal_value(data)


def body_limit_enforce(request: Request) -> None:
    """Read the whole body before anything runs, or refuse the request (SPEC 1: no money
    moves on a request we did not read). 411 without a Content-Length: WSGI hands a chunked
    body to Django as empty, and a view would run on `{}`. 413 over
    DATA_UPLOAD_MAX_MEMORY_SIZE: reading `HttpRequest.body` applies the check DRF's parsers
    skip. 400 for a body shorter than its Content-Length."""
    if request.META.get("HTTP_TRANSFER_ENCODING"):
        raise LengthRequired()
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if limit is not None and declared > limit:
        raise PayloadTooLarge()
    try:
        body = request._request.body
    except RequestDataTooBig:
        raise PayloadTooLarge() from None
    if len(body) != declared:
        raise BodyIncomplete()


class FaceMetadata(SimpleMetadata):
    """OPTIONS without serializer introspection (the viewsets have no `serializer_class`);
    the request bodies are documented in the OpenAPI schema."""

    def determine_actions(self, request: Request, view: Any) -> dict[str, Any]:
        return {}


# No docstring on the viewset classes: drf-spectacular documents an operation with the
# first docstring of the view's MRO, and the published schema must stay as it is.
class FaceViewSet(IdempotencyMixin, viewsets.GenericViewSet[Any]):
    face: ClassVar[str]
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [FacePermission]
    throttle_classes = [KeyAndTenantThrottle]
    parser_classes = [StrictJSONParser]
    renderer_classes = [JSONRenderer]
    metadata_class = FaceMetadata
    pagination_class = CursorPagination

    params: dict[str, Any]  # the request's validated query (query())

    # Keys may come from the per-process cache: check_throttles confirms them.
    api_key_cache_confirmed: ClassVar[bool] = True

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        body_limit_enforce(request)
        super().initial(request, *args, **kwargs)

    def check_throttles(self, request: Request) -> None:
        # Before the idempotency layer, a key from the cache is confirmed against the key
        # epoch the throttles read (PostgreSQL decides when Redis is down); in `finally`, so
        # a dead key is told 401 even when a limit refused it.
        try:
            super().check_throttles(request)
        finally:
            api_key_cache_confirm(request, epoch_now=api_key_epoch_now(request))

    @property
    def principal(self) -> Principal:
        user = self.request.user
        assert isinstance(user, Principal)  # FacePermission ran before any handler
        return user

    def validated(self, serializer_class: type[S], *, data: Any | None = None) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data if data is None else data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def query(self, serializer_class: type[S]) -> dict[str, Any]:
        """The validated query parameters, kept as `self.params` (the paginator reads them)."""
        self.params = self.validated(serializer_class, data=self.request.query_params.dict())
        return self.params

    def list_response(
        self, queryset: QuerySet[Any], out: type[serializers.Serializer[Any]], *, prepare: Callable[[list[Any]], list[Any]] | None = None,
    ) -> Response:
        """One page of `queryset` (after `query()`); `prepare` (a selector) completes the
        page's rows before they are rendered (e.g. decrypted contact data)."""
        rows = self.paginate_queryset(queryset) or []
        return self.get_paginated_response(out(prepare(rows) if prepare else rows, many=True).data)

    @staticmethod
    def render(out: type[serializers.Serializer[Any]], obj: Any, *, status: int = 200, **extra: Any) -> Response:
        return Response({**out(obj).data, **extra}, status=status)


class CustomerViewSet(FaceViewSet):
    face = "customer"

    @property
    def customer(self) -> Customer:
        obj = self.principal.obj
        assert isinstance(obj, Customer)
        return obj


class TerminalViewSet(FaceViewSet):
    face = "terminal"

    @property
    def terminal(self) -> Terminal:
        obj = self.principal.obj
        assert isinstance(obj, Terminal)
        return obj


class MerchantViewSet(FaceViewSet):
    face = "merchant"

    @property
    def merchant_id(self) -> str:
        merchant_id = self.principal.merchant_id
        assert merchant_id is not None
        return merchant_id


class AdminViewSet(FaceViewSet):
    face = "admin"
    permission_classes = [FacePermission, StaffRolePermission]
    # action -> the permission its back-office twin needs ("app_label.codename"); any other is refused.
    action_permissions: ClassVar[dict[str, str]] = {}

    @property
    def staff_login(self) -> User:
        """The acting staff member's login, as StaffRolePermission read it for this request."""
        login = getattr(self.request._request, "staff_login", None)
        assert isinstance(login, User)
        return login

    @property
    def staff(self) -> StaffMember:
        obj = self.principal.obj
        assert isinstance(obj, StaffMember)
        return obj
