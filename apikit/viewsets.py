"""List, retrieve and create, written once: a face's viewset of one kind of object names its
shapes, its selectors (hooks) and the summaries of its operations, like DRF's generic views
(`get_queryset`, `get_object`; hooks of our own, so drf-spectacular never calls them to
type the path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import FaceViewSet
from apikit.pagination import ListParamsSerializer, list_serializer

Shape = type[serializers.Serializer[Any]]


# Mixins before the face's viewset: `class StoreViewSet(ListMixin, RetrieveMixin, MerchantViewSet)`;
# the router routes an action only where its method exists, so a collection takes the
# mixins of the operations it has. Each operation is documented from `summaries` (action ->
# summary) and the shapes. No docstrings: drf-spectacular would publish them (apikit.base).
class ObjectMixin(FaceViewSet):
    out: ClassVar[Shape]  # renders one object
    summaries: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "summaries" in vars(cls):
            extend_schema_view(**{action: _SCHEMAS[action](cls, summary) for action, summary in cls.summaries.items()})(cls)


class ListMixin(ObjectMixin):
    list_params: ClassVar[Shape] = ListParamsSerializer

    def objects(self, params: dict[str, Any]) -> QuerySet[Any]:
        """The queryset the list pages (a selector), from the validated query."""
        raise NotImplementedError

    def page_complete(self, rows: list[Any]) -> list[Any]:
        """The page's rows, completed before they are rendered (e.g. decrypted contact data)."""
        return rows

    def list(self, request: Request) -> Response:
        return self.list_response(self.objects(self.query(self.list_params)), self.out, prepare=self.page_complete)


class RetrieveMixin(ObjectMixin):
    def object_get(self, object_id: str) -> Any:
        """The object the path names, or the selector's 404."""
        raise NotImplementedError

    def retrieve(self, request: Request, **kwargs: str) -> Response:
        return self.render(self.out, self.object_get(kwargs[str(self.lookup_url_kwarg)]))


class CreateMixin(ObjectMixin):
    create_in: ClassVar[Shape]
    create_out: ClassVar[Shape | None] = None  # the answer's shape when not `out`

    def object_create(self, data: dict[str, Any]) -> Any:
        """The new object (a service), from the validated body."""
        raise NotImplementedError

    def create(self, request: Request) -> Response:
        return self.render(self.create_out or self.out, self.object_create(self.validated(self.create_in)), status=201)


def _list_schema(cls: Any, summary: str) -> Any:
    name = cls.out.__name__.removesuffix("Out") + "List"
    return extend_schema(tags=[cls.face], summary=summary, parameters=[cls.list_params], responses=list_serializer(cls.out, name))


def _retrieve_schema(cls: Any, summary: str) -> Any:
    return extend_schema(tags=[cls.face], summary=summary, responses=cls.out)


def _create_schema(cls: Any, summary: str) -> Any:
    return extend_schema(tags=[cls.face], summary=summary, request=cls.create_in, responses={201: cls.create_out or cls.out})


_SCHEMAS = {"list": _list_schema, "retrieve": _retrieve_schema, "create": _create_schema}


def object_action(
    tags: list[str], *, summary: str, body: Shape, out: Shape, status: int = 200, route: bool = True,
    target: Callable[[Any, str], Any] | None = None,
) -> Callable[[Callable[[Any, Any, dict[str, Any]], Any]], Any]:
    """A POST on the object the path names, written once: the object (`target`, else
    `object_get`: its 404 comes first, whatever the body), then the validated `body`, then
    the decorated `run(view, obj, data)`, whose result answers as `out`. An @action unless
    `route=False` (`update`, which FaceRouter routes itself)."""

    def decorate(run: Callable[[Any, Any, dict[str, Any]], Any]) -> Any:
        def view(self: RetrieveMixin, request: Request, **kwargs: str) -> Response:
            object_id = kwargs[str(self.lookup_url_kwarg)]
            obj = target(self, object_id) if target is not None else self.object_get(object_id)
            return self.render(out, run(self, obj, self.validated(body)), status=status)

        view.__name__, view.__qualname__ = run.__name__, run.__qualname__  # no __doc__: the schema would publish it
        routed = action(detail=True, methods=["post"])(view) if route else view
        return extend_schema(tags=tags, summary=summary, request=body, responses={status: out})(routed)

    return decorate
