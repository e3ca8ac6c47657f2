"""Merchant face (`sk_` keys): payments, refunds, intents, balance, stores, terminals,
webhook endpoints. Everything is scoped to the key's merchant."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from payments.api import lookups
from payments.api import serializers as s
from payments.api.base import MerchantView
from payments.api.pagination import ListParamsSerializer
from webhooks import selectors as webhook_selectors
from webhooks import services as webhook_services

TAG = ["merchant"]


class _MerchantView(MerchantView):
    @property
    def merchant_id(self) -> str:
        merchant_id = self.principal.merchant_id
        assert merchant_id is not None
        return merchant_id


class StoresView(_MerchantView):
    @extend_schema(tags=TAG, summary="List the merchant's stores", parameters=[ListParamsSerializer], responses=s.StoreList)
    def get(self, request: Request) -> Response:
        return self.list_response(lookups.store_list(merchant_id=self.merchant_id), s.StoreOut, self.query(ListParamsSerializer))


class StoreDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's stores", responses=s.StoreOut)
    def get(self, request: Request, store_id: str) -> Response:
        return self.render(s.StoreOut, lookups.store_get(store_id=store_id, merchant_id=self.merchant_id))


class TerminalsView(_MerchantView):
    @extend_schema(tags=TAG, summary="List the merchant's terminals", parameters=[ListParamsSerializer], responses=s.TerminalList)
    def get(self, request: Request) -> Response:
        return self.list_response(lookups.terminal_list(merchant_id=self.merchant_id), s.TerminalOut, self.query(ListParamsSerializer))


class TerminalDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve one of the merchant's terminals", responses=s.TerminalOut)
    def get(self, request: Request, terminal_id: str) -> Response:
        return self.render(s.TerminalOut, lookups.terminal_get(terminal_id=terminal_id, merchant_id=self.merchant_id))


class WebhookEndpointsView(_MerchantView):
    @extend_schema(tags=TAG, summary="List webhook endpoints", parameters=[ListParamsSerializer], responses=s.WebhookEndpointList)
    def get(self, request: Request) -> Response:
        endpoints = webhook_selectors.webhook_endpoint_list(merchant_id=self.merchant_id)
        return self.list_response(endpoints, s.WebhookEndpointOut, self.query(ListParamsSerializer))

    @extend_schema(
        tags=TAG, summary="Register a webhook endpoint (the signing secret is shown once)",
        request=s.WebhookEndpointCreateIn, responses={201: s.WebhookEndpointWithSecretOut},
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.WebhookEndpointCreateIn)
        merchant = lookups.merchant_get(merchant_id=self.merchant_id)
        endpoint, secret = webhook_services.webhook_endpoint_create(
            merchant=merchant, url=data["url"], enabled_events=data["enabled_events"], description=data["description"]
        )
        return self.render(s.WebhookEndpointOut, endpoint, status=201, secret=secret)


class WebhookEndpointDetailView(_MerchantView):
    @extend_schema(tags=TAG, summary="Retrieve a webhook endpoint (never its secret)", responses=s.WebhookEndpointOut)
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        return self.render(s.WebhookEndpointOut, endpoint)

    @extend_schema(tags=TAG, summary="Update a webhook endpoint", request=s.WebhookEndpointUpdateIn, responses={200: s.WebhookEndpointOut})
    def post(self, request: Request, endpoint_id: str) -> Response:
        data = self.validated(s.WebhookEndpointUpdateIn)
        endpoint = webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        endpoint = webhook_services.webhook_endpoint_update(endpoint=endpoint, **data)
        return self.render(s.WebhookEndpointOut, endpoint)


class WebhookEndpointRotateSecretView(_MerchantView):
    @extend_schema(
        tags=TAG, summary="Rotate the signing secret (the new one is shown once; the old one signs during the overlap)",
        request=s.WebhookSecretRotateIn, responses={200: s.WebhookEndpointWithSecretOut},
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        data = self.validated(s.WebhookSecretRotateIn)
        endpoint = webhook_selectors.webhook_endpoint_get(merchant_id=self.merchant_id, endpoint_id=endpoint_id)
        endpoint, secret = webhook_services.webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(seconds=data["overlap_seconds"]))
        return self.render(s.WebhookEndpointOut, endpoint, secret=secret)
