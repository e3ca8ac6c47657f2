"""Routes of the four API faces under /v1/ (SPEC 10 names are stable)."""

from __future__ import annotations

from django.urls import URLPattern, path, register_converter

from payments.api import admin, customer, merchant, terminal
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
    path("admin/adjustments", admin.AdjustmentsView.as_view(), name="admin-adjustments"),
    path("admin/adjustments/<oid:adjustment_id>", admin.AdjustmentDetailView.as_view(), name="admin-adjustment"),
    path("admin/customers/<oid:customer_id>/freeze", admin.CustomerFreezeView.as_view(), name="admin-customer-freeze"),
    path("admin/customers/<oid:customer_id>/unfreeze", admin.CustomerUnfreezeView.as_view(), name="admin-customer-unfreeze"),
    # customer
    path("customer/wallet", customer.WalletView.as_view(), name="customer-wallet"),
    path("customer/transactions", customer.TransactionsView.as_view(), name="customer-transactions"),
    path("customer/payment_tokens", customer.PaymentTokensView.as_view(), name="customer-payment-tokens"),
    path("customer/transfers", customer.TransfersView.as_view(), name="customer-transfers"),
    path("customer/transfers/<oid:transfer_id>", customer.TransferDetailView.as_view(), name="customer-transfer"),
    path("customer/topups", customer.TopUpsView.as_view(), name="customer-topups"),
    path("customer/topups/<oid:topup_id>", customer.TopUpDetailView.as_view(), name="customer-topup"),
    path("customer/payments", customer.PaymentsView.as_view(), name="customer-payments"),
    path("customer/payments/<oid:payment_id>", customer.PaymentDetailView.as_view(), name="customer-payment"),
    path("customer/refunds", customer.RefundsView.as_view(), name="customer-refunds"),
    path("customer/refunds/<oid:refund_id>", customer.RefundDetailView.as_view(), name="customer-refund"),
    # terminal
    path("terminal/payments", terminal.PaymentsView.as_view(), name="terminal-payments"),
    path("terminal/payments/<oid:payment_id>", terminal.PaymentDetailView.as_view(), name="terminal-payment"),
    path("terminal/refunds", terminal.RefundsView.as_view(), name="terminal-refunds"),
    # merchant
    path("merchant/balance", merchant.BalanceView.as_view(), name="merchant-balance"),
    path("merchant/payments", merchant.PaymentsView.as_view(), name="merchant-payments"),
    path("merchant/payments/<oid:payment_id>", merchant.PaymentDetailView.as_view(), name="merchant-payment"),
    path("merchant/refunds", merchant.RefundsView.as_view(), name="merchant-refunds"),
    path("merchant/refunds/<oid:refund_id>", merchant.RefundDetailView.as_view(), name="merchant-refund"),
    path("merchant/payment_intents", merchant.PaymentIntentsView.as_view(), name="merchant-payment-intents"),
    path("merchant/payment_intents/<oid:intent_id>", merchant.PaymentIntentDetailView.as_view(), name="merchant-payment-intent"),
    path("merchant/payment_intents/<oid:intent_id>/confirm", merchant.PaymentIntentConfirmView.as_view(), name="merchant-payment-intent-confirm"),
    path(
        "merchant/payment_intents/<oid:intent_id>/authorize",
        merchant.PaymentIntentAuthorizeView.as_view(),
        name="merchant-payment-intent-authorize",
    ),
    path("merchant/payment_intents/<oid:intent_id>/capture", merchant.PaymentIntentCaptureView.as_view(), name="merchant-payment-intent-capture"),
    path("merchant/payment_intents/<oid:intent_id>/cancel", merchant.PaymentIntentCancelView.as_view(), name="merchant-payment-intent-cancel"),
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
