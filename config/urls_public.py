"""URLs served on the public (platform) host: the admin for tenants and platform staff."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
