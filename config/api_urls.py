"""Routes of the four API faces under /v1/: one FaceRouter per face (apikit/routers.py)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

from apikit import schema as _schema  # noqa: F401 - registers the OpenAPI extensions
from apikit.routers import FaceRouter
from payments.api import admin, customer, merchant, terminal
from webhooks.api import views as webhooks

customer_router = FaceRouter("customer")
customer_router.register("wallet", customer.WalletViewSet)
customer_router.register("contact", customer.ContactViewSet)
customer_router.register("transactions", customer.TransactionViewSet)
customer_router.register("payment_tokens", customer.PaymentTokenViewSet)
customer_router.register("transfers", customer.TransferViewSet)
customer_router.register("topups", customer.TopUpViewSet)
customer_router.register("payments", customer.PaymentViewSet)
customer_router.register("refunds", customer.RefundViewSet)
customer_router.register("mandates", customer.MandateViewSet)
customer_router.register("statements", customer.StatementViewSet)

terminal_router = FaceRouter("terminal")
terminal_router.register("payments", terminal.PaymentViewSet)
terminal_router.register("refunds", terminal.RefundViewSet)

merchant_router = FaceRouter("merchant")
merchant_router.register("balance", merchant.BalanceViewSet)
merchant_router.register("payments", merchant.PaymentViewSet)
merchant_router.register("refunds", merchant.RefundViewSet)
merchant_router.register("payment_intents", merchant.PaymentIntentViewSet)
merchant_router.register("payouts", merchant.PayoutViewSet)
merchant_router.register("stores", merchant.StoreViewSet)
merchant_router.register("terminals", merchant.TerminalViewSet)
merchant_router.register("statements", merchant.StatementViewSet)
merchant_router.register("webhook_endpoints", webhooks.WebhookEndpointViewSet)
merchant_router.register("events", webhooks.EventViewSet)

admin_router = FaceRouter("admin")
admin_router.register("customers", admin.CustomerViewSet)
admin_router.register("merchants", admin.MerchantViewSet)
admin_router.register("stores", admin.StoreViewSet)
admin_router.register("terminals", admin.TerminalViewSet)
admin_router.register("api_keys", admin.ApiKeyViewSet)
admin_router.register("adjustments", admin.AdjustmentViewSet)
admin_router.register("pending_adjustments", admin.PendingAdjustmentViewSet)
admin_router.register("fee_schedules", admin.FeeScheduleViewSet)

ROUTERS = {"customer": customer_router, "terminal": terminal_router, "merchant": merchant_router, "admin": admin_router}

urlpatterns: list[URLPattern | URLResolver] = [path(f"{face}/", include(router.urls)) for face, router in ROUTERS.items()]
