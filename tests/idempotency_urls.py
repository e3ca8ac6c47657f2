"""Test-only views and urlconf that drive the idempotency mixin (tests/test_idempotency*.py).

`EffectView` has a trivial internal effect that writes rows (a customer and its
account) and knobs in the body to refuse (402), fail validation (400), crash (500) or
stall on a test-controlled event. `PaymentView` calls the ledger's
`payments.services.payment_create` when it exists. Authentication is a test header
(`X-Test-Principal: <id>`), so these tests exercise the mechanism, not API keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.urls import include, path
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.idempotency import IdempotencyMixin
from apikit.principal import Principal
from wallets.errors import InsufficientFunds
from wallets.models import Customer
from wallets.services.principals import customer_create

# Test hooks: name -> callable run inside post() (e.g. wait on an Event, cut a proxy).
HOOKS: dict[str, Callable[[], None]] = {}
CALLS: dict[str, int] = {}
_calls_lock = threading.Lock()


class HeaderPrincipalAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Principal, None] | None:
        principal_id = request.META.get("HTTP_X_TEST_PRINCIPAL")
        if not principal_id:
            raise exceptions.NotAuthenticated()
        obj: Any = None
        principal_type = request.META.get("HTTP_X_TEST_PRINCIPAL_TYPE", "terminal")
        cut = HOOKS.get(request.META.get("HTTP_X_TEST_BEFORE_CLAIM", ""))
        if cut is not None:
            cut()  # runs in initial(), after tenant resolution, before the idempotency claim
        if principal_id.startswith("ter_"):
            from wallets.models import Terminal

            obj = Terminal.objects.select_related("store").filter(id=principal_id).first()
        return Principal(type=principal_type, id=principal_id, obj=obj, api_key=None), None  # type: ignore[arg-type]

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="test"'


class _Base(IdempotencyMixin):
    authentication_classes = [HeaderPrincipalAuthentication]
    permission_classes: list[Any] = []
    throttle_classes: list[Any] = []
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]


def _count(name: str) -> None:
    with _calls_lock:
        CALLS[name] = CALLS.get(name, 0) + 1


class EffectView(_Base):
    face = "terminal"

    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise exceptions.ValidationError({"name": ["This field is required."]})
        name = data["name"]
        _count(name)
        customer = customer_create(name=name)
        hook = HOOKS.get(str(data.get("hook", "")))
        if hook is not None:
            hook()
        if data.get("refuse"):
            raise InsufficientFunds("not enough money", param="amount")
        if data.get("crash"):
            raise RuntimeError("boom")
        minted = self.idempotency.mint("thing", "thg")
        return Response({"id": minted, "customer": customer.id, "name": name, "amount": data.get("amount")}, status=201)


class OptionalFaceView(EffectView):
    face = "customer"


class ExternalView(_Base):
    """An external effect: the claim commits first, the 'provider call' is a hook."""

    face = "customer"
    idempotency_effect = "external"
    idempotency_mint = {"topup": "top"}
    idempotency_lease_seconds = 1

    def idempotency_on_claim(self, ctx: Any) -> None:
        # The pending object and outbox row would be written here; a row proves it commits with the claim.
        customer_create(name=f"claim:{ctx.minted['topup']}:{ctx.fence}")

    def post(self, request: Request) -> Response:
        data = request.data
        name = str(data.get("name", ""))
        _count(name)
        hook = HOOKS.get(str(data.get("hook", "")))
        if hook is not None:
            hook()
        ctx = self.idempotency
        return Response({"topup": ctx.minted["topup"], "fence": ctx.fence, "name": name}, status=201)


class PaymentView(_Base):
    face = "terminal"

    def post(self, request: Request) -> Response:
        from apikit.principal import Principal as P
        from payments.services.charges import payment_create

        principal = request.user
        assert isinstance(principal, P)
        data = request.data
        customer = Customer.objects.get(id=data["customer"])
        payment = payment_create(terminal=principal.obj, customer=customer, asset_code=data["asset"], amount=int(data["amount"]))
        return Response({"id": payment.id, "amount": payment.amount, "asset": data["asset"]}, status=201)


urlpatterns = [
    path("v1/test/effect", EffectView.as_view()),
    path("v1/test/optional", OptionalFaceView.as_view()),
    path("v1/test/external", ExternalView.as_view()),
    path("v1/test/payments", PaymentView.as_view()),
    path("", include("config.urls")),  # the real faces stay reachable
]
