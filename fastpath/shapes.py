"""Serializers whose per-instance fields are a shallow copy of the declared ones where
that is safe (the faces' shapes stand on it through apikit.shapes).

DRF deep-copies each declared field per serializer instance: 0.6-0.9 ms of CPU a payment
(docs/BENCHMARKS.md). A declared field is only a template that `bind()` and validation
assign attributes on, so a copy of its `__dict__` serves, its containers copied one
level down so an edit never reaches the template.

A field is deep-copied as DRF does when it holds other fields (a nested serializer,
`child`, `child_relation`), has its own `__deepcopy__`, or has a mutable default or
initial value (a list, `CreateOnlyDefault`)."""

from __future__ import annotations

import copy
import inspect
from typing import Any

from rest_framework import serializers
from rest_framework.fields import Field
from rest_framework.utils.formatting import lazy_format

_IMMUTABLE = (str, int, bytes, bool, type(None), type(serializers.empty))
_NOT_COPIED = frozenset({"_args", "_kwargs"})  # the constructor's arguments: read only by DRF's deep copy


def _shareable(value: object) -> bool:
    return isinstance(value, _IMMUTABLE) or inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value)


def field_copies_shallowly(field: Field[Any, Any, Any, Any]) -> bool:
    """Whether `field_template_copy` copies this declared field shallowly (module docstring)."""
    return (
        type(field).__deepcopy__ is Field.__deepcopy__
        and not isinstance(field, serializers.BaseSerializer)
        and not hasattr(field, "child")
        and not hasattr(field, "child_relation")
        and _shareable(field.default)
        and _shareable(field.initial)
    )


def field_template_copy(field: Field[Any, Any, Any, Any]) -> Field[Any, Any, Any, Any]:
    """A fresh, unbound copy of a declared field: shallow where that is safe (above)."""
    try:
        containers = _COPY_PLANS[field]
    except KeyError:
        containers = _copy_plan(field)
    if containers is None:
        return copy.deepcopy(field)
    clone = object.__new__(type(field))  # Field.__new__ only records _args/_kwargs: copied below
    state = clone.__dict__
    state.update(field.__dict__)
    for name in containers:
        state[name] = state[name].copy()
    if "_validators" in state:  # the one container Field may add to a template later (lazily)
        state["_validators"] = list(state["_validators"])
    return clone


# Per declared field (a template lives as long as its class): None to deep-copy it, else the
# names of its containers to copy. Decided once, as this runs for every field of every request.
_COPY_PLANS: dict[Field[Any, Any, Any, Any], tuple[str, ...] | None] = {}


def _copy_plan(field: Field[Any, Any, Any, Any]) -> tuple[str, ...] | None:
    plan = (
        tuple(
            name for name, value in vars(field).items() if name not in _NOT_COPIED and name != "_validators" and isinstance(value, dict | list | set)
        )
        if field_copies_shallowly(field)
        else None
    )
    _COPY_PLANS[field] = plan
    return plan


class Serializer(serializers.Serializer[Any]):
    """DRF's Serializer; only the copying of the declared fields differs (module docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The copies share their template's validators, whose `lazy_format` messages format
        # and cache themselves on first use in a way two threads can trip over: formatted
        # here, once, at import (USE_I18N is off: no per-request language).
        for field in cls._declared_fields.values():
            for validator in field.__dict__.get("_validators", ()):
                message = getattr(validator, "message", None)
                if isinstance(message, lazy_format):
                    str(message)

    def get_fields(self) -> dict[str, Field[Any, Any, Any, Any]]:
        return {name: field_template_copy(field) for name, field in self._declared_fields.items()}
