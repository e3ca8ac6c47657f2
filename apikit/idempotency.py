"""DRF integration: every POST of a view that includes `IdempotencyMixin` goes through
the one idempotency mechanism, with no per-view code."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any, ClassVar

from django.db import DatabaseError, connection
from django.http import HttpResponse
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency import metrics
from idempotency.canonical import fingerprint_compute, idempotency_key_is_valid
from idempotency.engine import Executed, IdempotencyContext, IdempotentCall, StoredResponse
from idempotency.entry import idempotency_execute, idempotency_execute_external
from idempotency.errors import IdempotencyError, IdempotencyKeyInvalid, IdempotencyKeyMissing
from idempotency.hotpath import ReplayPrefetch
from idempotency.sealing import response_body_seal, response_body_unseal
from idempotency.selectors import idempotency_policy_get
from wallets import ids
from wallets.errors import Unavailable
from wallets.transactions import is_connection_failure

HEADER = "Idempotency-Key"
# Headers of the transport or of this one request (each gets its own Request-Id), never stored.
_UNSTORED_HEADERS = {
    "vary", "allow", "request-id", "set-cookie", "date", "content-length", "connection",
    "idempotent-replayed", "original-request", "retry-after",
}


def request_id_of(request: Any) -> str:
    rid = getattr(request, "request_id", None) or getattr(getattr(request, "_request", None), "request_id", None)
    return str(rid) if rid else ids.new_id("req")


class IdempotencyMixin(APIView):
    """Makes every POST of the view idempotent (SPEC 6). Put it before APIView.

    The view sets ``face`` (the tenant's mode for it: a key mandatory or optional) and has a
    ``Principal`` as ``request.user``; optionally ``idempotency_effect = "external"`` with the
    mint, lease and claim/release hooks below, and ``idempotency_response_contains_secret``
    (the stored body is sealed). ``post()`` sees the context as ``self.idempotency``. An
    internal effect's ``post()`` runs in the claim's transaction, perhaps more than once
    (conflicts are retried whole), so it touches nothing outside the database; an answer
    >= 400 rolls its writes back (a 402 is then stored alone).
    """

    face: ClassVar[str]
    idempotency_effect: ClassVar[str] = "internal"
    idempotency_mint: ClassVar[dict[str, str]] = {}
    idempotency_lease_seconds: ClassVar[int | None] = None
    idempotency_response_contains_secret: ClassVar[bool] = False
    idempotency: IdempotencyContext

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        handler = getattr(self, "post", None)
        if request.method == "POST" and handler is not None:
            # DRF's dispatch looks the handler up by name after initial(), so an instance
            # attribute wraps this request's post() (on a viewset, the action bound to POST).
            setattr(self, "post", functools.partial(self._idempotent_post, handler))  # noqa: B010

    def idempotency_on_claim(self, ctx: IdempotencyContext) -> None:
        """External effects: writes committed with the claim, again on every takeover (make
        it get-or-create). Raising here rolls the claim back: the error is the answer."""

    def idempotency_on_release(self, ctx: IdempotencyContext) -> None:
        """External effects: undo `idempotency_on_claim`'s writes when a 4xx is discarded."""

    def idempotency_lease_for(self) -> int | None:
        """The lease of an external claim (seconds), None for the tenant's default."""
        return self.idempotency_lease_seconds

    def idempotency_finish(self, produce: Callable[[], HttpResponseBase]) -> HttpResponseBase:
        """External effects: `produce()` does the final writes and returns the response inside
        the fenced completion, so a holder whose lease was taken over writes nothing. Returns
        a placeholder: the produced response is what the client gets."""
        self.idempotency.complete_with = lambda: self._executed(produce(), seal=False)
        return HttpResponse(status=204)

    def _executed(self, response: HttpResponseBase, *, seal: bool) -> Executed:
        """The rendered response, and what to store of it (sealed when it holds a secret)."""
        if isinstance(response, Response):
            response = self.finalize_response(self.request, response)
            response.render()
        body = bytes(response.content)  # type: ignore[attr-defined]
        if seal:
            body = response_body_seal(body=body, principal_id=self.idempotency.principal_id, key=str(self.idempotency.key))
        headers = {name: str(value) for name, value in response.items() if name.lower() not in _UNSTORED_HEADERS}
        return Executed(response=StoredResponse(status=response.status_code, headers=headers, body=body), value=response)

    def _idempotent_post(self, handler: Callable[..., HttpResponseBase], request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            return self._idempotency_dispatch(handler, request, args, kwargs)
        except (IdempotencyError, Unavailable, DatabaseError) as exc:
            if isinstance(exc, DatabaseError) and not is_connection_failure(exc):
                raise
            return self.handle_exception(exc)  # a lost connection: 503, fail closed (apikit/errors.py)

    def _idempotency_dispatch(
        self, handler: Callable[..., HttpResponseBase], request: Request, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> HttpResponseBase:
        tenant = getattr(request, "tenant", None) or getattr(request._request, "tenant", None) or getattr(connection, "tenant", None)
        face = str(getattr(self, "face", "other"))
        mode_for = getattr(tenant, "idempotency_mode_for", None)
        mode = str(mode_for(face)) if callable(mode_for) and hasattr(tenant, f"idempotency_{face}") else "mandatory"
        principal_id = str(getattr(request.user, "id", None) or "anonymous")
        raw_key = request.META.get("HTTP_IDEMPOTENCY_KEY")
        if raw_key is None:
            metrics.IDEMPOTENCY_MISSING_KEYS.labels(face=face, mode=mode).inc()
            if mode != "optional":
                raise IdempotencyKeyMissing(f"{HEADER} header is required on this endpoint")
            self.idempotency = IdempotencyContext(principal_id=principal_id, key=None, record_id=None, fence=0)
            return handler(request, *args, **kwargs)
        if not idempotency_key_is_valid(raw_key):
            raise IdempotencyKeyInvalid(f"{HEADER} must be 1 to 255 printable ASCII characters")

        try:
            body = bytes(request._request.body)
        except RawPostDataException:  # a parser consumed the stream first: use what it parsed
            body = json.dumps(request.data, default=str).encode("utf-8")
        call = IdempotentCall(
            principal_id=principal_id, key=raw_key, scope=face,
            fingerprint=fingerprint_compute(method=str(request.method), path=request.path, principal_id=principal_id, body=body),
            request_id=request_id_of(request), method=str(request.method), path=request.path,
        )
        policy = idempotency_policy_get(tenant=tenant)
        lease_seconds = self.idempotency_lease_for()
        if lease_seconds is not None:
            policy = dataclasses.replace(policy, lease_seconds=lease_seconds)

        def execute(ctx: IdempotencyContext) -> Executed:
            self.idempotency = ctx
            try:
                response = handler(request, *args, **kwargs)
            except DatabaseError:
                raise  # conflicts are retried whole by the layer; connection loss answers 503
            except Exception as exc:  # noqa: BLE001 - every failure of the view becomes its response
                response = self.handle_exception(exc)
            return self._executed(response, seal=self.idempotency_response_contains_secret)

        if self.idempotency_effect == "external":
            outcome = idempotency_execute_external(
                call=call, policy=policy, execute=execute, mint=dict(self.idempotency_mint), on_claim=self.idempotency_on_claim,
                on_release=self.idempotency_on_release,
            )
        else:
            prefetched = getattr(request._request, "idempotency_replay_prefetch", None)
            outcome = idempotency_execute(
                call=call, policy=policy, execute=execute, prefetched=prefetched if isinstance(prefetched, ReplayPrefetch) else None
            )
        if not outcome.replayed:
            value = outcome.value
            assert isinstance(value, HttpResponseBase)
            return value
        body = response_body_unseal(stored=outcome.response.body, principal_id=call.principal_id, key=call.key)
        headers = {**outcome.response.headers, "Idempotent-Replayed": "true", "Original-Request": outcome.original_request_id}
        return HttpResponse(content=body, status=outcome.response.status, headers=headers)
