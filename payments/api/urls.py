"""Routes of the four API faces under /v1/ (SPEC 10 names are stable)."""

from __future__ import annotations

from django.urls import URLPattern, path, register_converter

from payments.api import admin, merchant
from payments.api import schema as _schema  # noqa: F401 - registers the OpenAPI extensions


class ObjectIdConverter:
    """Only well-formed ids reach a view; anything else (NUL bytes, 10 kB junk) is a 404."""

    regex = r"[a-z]{2,4}_[A-Za-z0-9]{1,40}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ObjectIdConverter, "oid")

urlpatterns: list[URLPattern] = [
    # admin
    path("admin/customers", admin.CustomersView.as_view(), name="admin-customers"),
    path("admin/customers/<oid:customer_id>", admin.CustomerDetailView.as_view(), name="admin-customer"),
    path("admin/merchants", admin.MerchantsView.as_view(), name="admin-merchants"),
    path("admin/merchants/<oid:merchant_id>", admin.MerchantDetailView.as_view(), name="admin-merchant"),
    path("admin/stores", admin.StoresView.as_view(), name="admin-stores"),
    path("admin/stores/<oid:store_id>", admin.StoreDetailView.as_view(), name="admin-store"),
    path("admin/terminals", admin.TerminalsView.as_view(), name="admin-terminals"),
    path("admin/terminals/<oid:terminal_id>", admin.TerminalDetailView.as_view(), name="admin-terminal"),
    path("admin/api_keys", admin.ApiKeysView.as_view(), name="admin-api-keys"),
    path("admin/api_keys/<oid:api_key_id>", admin.ApiKeyDetailView.as_view(), name="admin-api-key"),
    path("admin/api_keys/<oid:api_key_id>/rotate", admin.ApiKeyRotateView.as_view(), name="admin-api-key-rotate"),
    path("admin/api_keys/<oid:api_key_id>/revoke", admin.ApiKeyRevokeView.as_view(), name="admin-api-key-revoke"),
    # merchant
    path("merchant/stores", merchant.StoresView.as_view(), name="merchant-stores"),
    path("merchant/stores/<oid:store_id>", merchant.StoreDetailView.as_view(), name="merchant-store"),
    path("merchant/terminals", merchant.TerminalsView.as_view(), name="merchant-terminals"),
    path("merchant/terminals/<oid:terminal_id>", merchant.TerminalDetailView.as_view(), name="merchant-terminal"),
    path("merchant/webhook_endpoints", merchant.WebhookEndpointsView.as_view(), name="merchant-webhook-endpoints"),
    path("merchant/webhook_endpoints/<oid:endpoint_id>", merchant.WebhookEndpointDetailView.as_view(), name="merchant-webhook-endpoint"),
    path(
        "merchant/webhook_endpoints/<oid:endpoint_id>/rotate_secret",
        merchant.WebhookEndpointRotateSecretView.as_view(),
        name="merchant-webhook-endpoint-rotate-secret",
    ),
]
