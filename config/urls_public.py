"""URLs served on the public (platform) host: the platform admin for tenants."""

from django.urls import path

from tenants.admin import admin_sites_split, platform_site

admin_sites_split()

urlpatterns = [path("admin/", platform_site.urls)]
