"""DRF integration: every POST of a view that includes `IdempotencyMixin` goes through
the one idempotency mechanism, with no per-view code.

Contract for the view (see `IdempotencyMixin`'s docstring).
"""

from __future__ import annotations

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

from payments.idempotency import metrics
from payments.idempotency.cache import ReplayPrefetch
from payments.idempotency.canonical import fingerprint_compute, idempotency_key_is_valid
from payments.idempotency.errors import IdempotencyError, IdempotencyKeyInvalid, IdempotencyKeyMissing
from payments.idempotency.sealing import response_body_seal, response_body_unseal
from payments.idempotency.selectors import IdempotencyPolicy, idempotency_policy_get
from payments.idempotency.services import (
    Executed,
    IdempotencyContext,
    IdempotentCall,
    Outcome,
    StoredResponse,
    idempotency_execute,
    idempotency_execute_external,
)
from wallets import ids
from wallets import metrics as wallet_metrics
from wallets.errors import Unavailable
from wallets.transactions import is_connection_failure

HEADER = "Idempotency-Key"
# Headers that belong to the transport or to this particular request, never to the
# stored answer (each response gets its own Request-Id).
_UNSTORED_HEADERS = {
    "vary", "allow", "request-id", "set-cookie", "date", "content-length", "connection",
    "idempotent-replayed", "original-request", "retry-after",
}


def request_id_of(request: Any) -> str:
    rid = getattr(request, "request_id", None) or getattr(getattr(request, "_request", None), "request_id", None)
    return str(rid) if rid else ids.new_id("req")


class IdempotencyMixin(APIView):
    """Makes every POST of the view idempotent (SPEC 6). Put it before APIView.

    The view supplies:
      - ``face`` ("customer" | "terminal" | "merchant" | "admin"): picks the tenant's
        mode (``Tenant.idempotency_<face>``: ``mandatory`` -> 400
        ``idempotency_key_missing`` without a key; ``optional`` -> executed without the
        mechanism, counted in ``tally_idempotency_missing_keys_total``);
      - ``request.user``: a ``Principal``; ``.id`` is the principal of the key scope;
      - optionally ``idempotency_effect = "external"`` (default ``"internal"``),
        ``idempotency_mint`` ({"topup": "top"}: ids minted at claim, external only),
        ``idempotency_lease_seconds`` and an ``idempotency_on_claim(ctx)`` method
        (external only: runs in the claim's transaction; write the pending object and its
        outbox row there);
      - ``idempotency_response_contains_secret = True`` on views that answer a secret
        shown once (API keys, webhook secrets, payment tokens): the stored body is sealed
        (payments/idempotency/sealing.py) and unsealed for the replay.

    The view's ``post()`` just does its work and returns a Response or raises. During
    it, ``self.idempotency`` is the ``IdempotencyContext`` (``.key`` None when unkeyed;
    ``.mint(name, prefix)`` gives ids stable across re-executions of the key).

    Internal effect: ``post()`` runs inside the transaction that holds the claim and
    will hold the stored response (one commit). If it raises or answers >= 400, that
    whole transaction is rolled back (its writes and the claim); a 402 is then stored
    under a fresh claim in a second short transaction, without running ``post()`` again.
    It may run more than once (database conflicts are retried whole), so it must not
    touch anything outside the database.
    Exceptions become responses through ``self.handle_exception``, i.e. the faces' one
    exception handler (apikit/errors.py), which renders the SPEC envelope.

    Then: 2xx and 402 are stored (exact rendered bytes, status, headers) and replayed;
    other 4xx are not stored (the next request with the key executes); 5xx and crashes
    leave the record ``failed_retryable``. Replays carry ``Idempotent-Replayed: true`` and
    ``Original-Request``. Answers of the layer itself: 400 ``idempotency_key_missing`` /
    ``idempotency_key_invalid``, 409 ``idempotency_key_in_use`` (+Retry-After), 410
    ``idempotency_key_expired``, 422 ``idempotency_key_reused``, 503 ``unavailable``
    (+Retry-After) when PostgreSQL is down.
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
            # DRF's dispatch looks the handler up by name after initial(): an instance
            # attribute wraps this one request's post() without any per-view code. On a
            # viewset, `post` is the action the router maps to POST on that route (create,
            # update or an @action), bound by ViewSetMixin.as_view before dispatch.
            setattr(self, "post", functools.partial(self._idempotent_post, handler))  # noqa: B010

    def idempotency_on_claim(self, ctx: IdempotencyContext) -> None:
        """External effects: extra writes committed together with the claim. Runs again on
        every takeover of the key (same minted ids): make it get-or-create. Raising here
        (validation) rolls the claim back: nothing is stored, the error is the answer."""

    def idempotency_on_release(self, ctx: IdempotencyContext) -> None:
        """External effects: undo `idempotency_on_claim`'s writes when the answer is a
        discarded 4xx (runs in the transaction that releases the claim)."""

    def idempotency_lease_for(self) -> int | None:
        """The lease of an external claim (seconds), None for the tenant's default."""
        return self.idempotency_lease_seconds

    def idempotency_finish(self, produce: Callable[[], HttpResponseBase]) -> HttpResponseBase:
        """External effects: finish inside the fenced completion. `produce()` does the
        final writes and returns the response; it runs in the transaction that checks our
        fence and stores that response (payments.idempotency.services.
        idempotency_complete_produced), so a holder whose lease was taken over writes
        nothing. Returns a placeholder: the produced response is what the client gets."""
        request = self.request

        def complete() -> Executed:
            response = produce()
            if isinstance(response, Response):
                response = self.finalize_response(request, response)
                response.render()
            body = bytes(response.content)  # type: ignore[attr-defined]
            return Executed(response=StoredResponse(status=response.status_code, headers=_storable_headers(response), body=body), value=response)

        self.idempotency.complete_with = complete
        return HttpResponse(status=204)

    # --- internals ------------------------------------------------------------------

    def _idempotent_post(self, handler: Callable[..., HttpResponseBase], request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            return self._idempotency_dispatch(handler, request, args, kwargs)
        except (IdempotencyError, Unavailable) as exc:
            return self.handle_exception(exc)
        except DatabaseError as exc:
            if not is_connection_failure(exc):
                raise
            wallet_metrics.FAIL_CLOSED.labels(store="postgres").inc()
            return self.handle_exception(Unavailable("database unavailable: retry later"))

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
            self.idempotency = IdempotencyContext(principal_id=principal_id, key=None, record_id=None, fence=0, claimed_at=None)
            return handler(request, *args, **kwargs)
        if not idempotency_key_is_valid(raw_key):
            raise IdempotencyKeyInvalid(f"{HEADER} must be 1 to 255 printable ASCII characters")

        call = IdempotentCall(
            principal_id=principal_id, key=raw_key, scope=face,
            fingerprint=fingerprint_compute(method=str(request.method), path=request.path, principal_id=principal_id, body=self._raw_body(request)),
            request_id=request_id_of(request), method=str(request.method), path=request.path,
        )
        policy = idempotency_policy_get(tenant=tenant)
        lease_seconds = self.idempotency_lease_for()
        if lease_seconds is not None:
            policy = IdempotencyPolicy(
                wait_ms=policy.wait_ms, replay_window_seconds=policy.replay_window_seconds,
                tombstone_window_seconds=policy.tombstone_window_seconds, lease_seconds=lease_seconds,
            )
        external = self.idempotency_effect == "external"

        def execute(ctx: IdempotencyContext) -> Executed:
            self.idempotency = ctx
            response = self._run_handler(handler, request, args, kwargs)
            if isinstance(response, Response):
                response = self.finalize_response(request, response, *args, **kwargs)
                response.render()
            body = bytes(response.content)  # type: ignore[attr-defined]
            if self.idempotency_response_contains_secret:
                body = response_body_seal(body=body, principal_id=call.principal_id, key=call.key)
            stored = StoredResponse(status=response.status_code, headers=_storable_headers(response), body=body)
            return Executed(response=stored, value=response)

        if external:
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
        return _replay_response(outcome, call)

    def _run_handler(
        self, handler: Callable[..., HttpResponseBase], request: Request, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> HttpResponseBase:
        try:
            return handler(request, *args, **kwargs)
        except DatabaseError:
            raise  # conflicts are retried whole by the layer; connection loss answers 503
        except Exception as exc:  # noqa: BLE001 - every failure of the view becomes its response
            return self.handle_exception(exc)


    @staticmethod
    def _raw_body(request: Request) -> bytes:
        try:
            return bytes(request._request.body)
        except RawPostDataException:
            # A parser consumed the stream first: fall back to what it parsed.
            return json.dumps(request.data, default=str).encode("utf-8")



def _storable_headers(response: HttpResponseBase) -> dict[str, str]:
    return {name: str(value) for name, value in response.items() if name.lower() not in _UNSTORED_HEADERS}


def _replay_response(outcome: Outcome, call: IdempotentCall) -> HttpResponse:
    body = response_body_unseal(stored=outcome.response.body, principal_id=call.principal_id, key=call.key)
    response = HttpResponse(content=body, status=outcome.response.status)
    for name, value in outcome.response.headers.items():
        response[name] = value
    response["Idempotent-Replayed"] = "true"
    response["Original-Request"] = outcome.original_request_id
    return response
