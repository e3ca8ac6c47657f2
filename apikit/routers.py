"""The router of one face (built per face by config/api_urls.py). Stripe-style routes
without trailing slashes: `{prefix}` (GET list, POST create), `{prefix}/{id}` (GET retrieve,
POST update; no PUT/PATCH), and `@action`s under either. A malformed id (not
OBJECT_ID_PATTERN) matches no route: the 404 envelope."""

from __future__ import annotations

from rest_framework.routers import DynamicRoute, Route, SimpleRouter
from rest_framework.viewsets import ViewSetMixin

from apikit.base import FaceViewSet
from apikit.fields import OBJECT_ID_PATTERN


class FaceRouter(SimpleRouter):
    routes = [
        Route(
            url=r"^{prefix}{trailing_slash}$",
            mapping={"get": "list", "post": "create"},
            name="{basename}-list",
            detail=False,
            initkwargs={"suffix": "List"},
        ),
        DynamicRoute(url=r"^{prefix}/{url_path}{trailing_slash}$", name="{basename}-{url_name}", detail=False, initkwargs={}),
        Route(
            url=r"^{prefix}/{lookup}{trailing_slash}$",
            mapping={"get": "retrieve", "post": "update"},
            name="{basename}-detail",
            detail=True,
            initkwargs={"suffix": "Instance"},
        ),
        DynamicRoute(url=r"^{prefix}/{lookup}/{url_path}{trailing_slash}$", name="{basename}-{url_name}", detail=True, initkwargs={}),
    ]

    def __init__(self, face: str) -> None:
        super().__init__(trailing_slash=False)
        self.face = face

    def register(self, prefix: str, viewset: type[ViewSetMixin], basename: str | None = None) -> None:
        """Only this face's viewsets: their face gate, auth and idempotency come from FaceViewSet."""
        if not (isinstance(viewset, type) and issubclass(viewset, FaceViewSet)) or viewset.face != self.face:
            raise TypeError(f"{viewset!r} is not a {self.face} FaceViewSet")
        super().register(prefix, viewset, basename=f"{self.face}-{basename or prefix}")

    def get_lookup_regex(self, viewset: type[ViewSetMixin], lookup_prefix: str = "") -> str:
        lookup_url_kwarg = getattr(viewset, "lookup_url_kwarg", None) or getattr(viewset, "lookup_field", "pk")
        return f"(?P<{lookup_prefix}{lookup_url_kwarg}>{OBJECT_ID_PATTERN})"
