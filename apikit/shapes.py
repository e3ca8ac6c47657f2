"""The base of every request and response shape of the faces: DRF's Serializer, its declared
fields copied per instance the fast way (fastpath.shapes); and the head every API object
starts with (ObjectOut)."""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework import serializers

from apikit.fields import ConstField
from fastpath.shapes import Serializer as FieldCopyingSerializer

Serializer = FieldCopyingSerializer


# An API object: `id`, `object` (its type: the subclass's `object_type`) and `created` first,
# then the subclass's own fields. No docstring: drf-spectacular would publish it as the
# description of every object's schema.
class ObjectOut(Serializer):
    object_type: ClassVar[str]
    id = serializers.CharField()
    object = ConstField("")
    created = serializers.DateTimeField()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # DRF's metaclass has already gathered the fields: `object` keeps its place.
        if "object_type" in vars(cls):
            cls._declared_fields = {**cls._declared_fields, "object": ConstField(cls.object_type)}
        elif not getattr(cls, "object_type", ""):
            raise TypeError(f"{cls.__name__} names no object_type")
        super().__init_subclass__(**kwargs)
