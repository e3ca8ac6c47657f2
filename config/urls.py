"""URLs served on a tenant's host."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from payments.api.psp_webhooks import PspWebhookView
from tenants.admin import admin_sites_split

admin_sites_split()  # public-schema models belong to the platform admin only

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/schema", SpectacularAPIView.as_view(), name="schema"),
    path("v1/docs", SpectacularRedocView.as_view(url_name="schema"), name="docs"),
    path("v1/docs/swagger", SpectacularSwaggerView.as_view(url_name="schema"), name="docs-swagger"),
    path("v1/", include("config.api_urls")),  # the four faces, one router each
    path("v1/psp/webhooks/<str:gateway>", PspWebhookView.as_view(), name="psp-webhook"),  # signed by the PSP, no API key
]

# Errors that never reach a DRF view (unknown route or tenant host, crashes outside a
# view) still answer the SPEC envelope on /v1/ paths.
handler400 = "apikit.errors.handler400"
handler403 = "apikit.errors.handler403"
handler404 = "apikit.errors.handler404"
handler500 = "apikit.errors.handler500"
