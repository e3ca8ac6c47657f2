"""Inbound PSP webhooks: `POST /v1/psp/webhooks/<gateway>` on the tenant's host,
authenticated by the PSP's signature (payments/services/psp_webhooks.py), not an API key."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apikit.schema import ErrorSerializer
from payments.services.psp_webhooks import psp_webhook_receive
from wallets.errors import NotFound, TallyError, Unavailable

logger = logging.getLogger("tally.topups")

MAX_BODY_BYTES = 256 * 1024
SIGNATURE_HEADERS = {"simulator": "HTTP_PSP_SIGNATURE", "stripe": "HTTP_STRIPE_SIGNATURE"}


class PspWebhookView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes: list[Any] = []

    @extend_schema(
        tags=["psp"], summary="Inbound PSP webhook (signed by the PSP; no API key)", request=None, auth=[],
        description=(
            "The tenant's PSP reports charge outcomes here. `Psp-Signature` (simulator) or `Stripe-Signature` (Stripe): "
            "`t=<unix>,v1=<hex HMAC-SHA256 of \"t.body\">` with one of the tenant's webhook secrets (several may be valid "
            "during a rotation), at most 300 s old. Each event id is applied once; unknown event types are acknowledged. "
            "An event about a top-up of another gateway (`outcome: wrong_gateway`), or a successful charge whose amount or "
            "currency is not the top-up's (`mismatch`: the top-up waits for an operator), is recorded and acknowledged with "
            "no credit: the provider would retry a 4xx for days with nothing to gain."
        ),
        parameters=[OpenApiParameter("gateway", str, OpenApiParameter.PATH, enum=sorted(SIGNATURE_HEADERS))],
        responses={
            200: inline_serializer("PspWebhookReceived", {"received": serializers.BooleanField(), "outcome": serializers.CharField()}),
            400: OpenApiResponse(ErrorSerializer, description="`signature_invalid`, `signature_timestamp_out_of_tolerance`, `event_invalid`."),
            404: OpenApiResponse(ErrorSerializer, description="Unknown gateway, or none configured for this operator."),
            503: OpenApiResponse(ErrorSerializer, description="The effect failed; nothing was recorded: retry."),
        },
    )
    def post(self, request: Request, gateway: str) -> Response:
        if gateway not in SIGNATURE_HEADERS:
            raise NotFound("no such gateway", param="gateway")
        body = request._request.body
        if len(body) > MAX_BODY_BYTES:
            raise RequestDataTooBig("request body too large")
        signature = request._request.META.get(SIGNATURE_HEADERS[gateway])
        try:
            outcome = psp_webhook_receive(gateway_name=gateway, signature=signature, body=body)
        except TallyError:
            raise
        except Exception as exc:
            # A failing handler: nothing was recorded (one transaction), the provider's retry is processed.
            logger.exception("psp webhook handler failed; the provider will retry")
            raise Unavailable("the event could not be applied now: retry later") from exc
        return Response({"received": True, "outcome": outcome})
