"""Routes of the four API faces under /v1/."""

from django.urls import path  # noqa: F401

urlpatterns: list = []  # type: ignore[type-arg]
