"""URLs served on a tenant's host."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from tenants.admin import admin_sites_split

admin_sites_split()  # public-schema models belong to the platform admin only

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/schema", SpectacularAPIView.as_view(), name="schema"),
    path("v1/docs", SpectacularRedocView.as_view(url_name="schema"), name="docs"),
    path("v1/", include("payments.api.urls")),
]
