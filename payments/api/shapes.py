"""The base of every request and response shape: DRF's Serializer, with its per-instance
fields made by a shallow copy of the declared ones where that is safe.

DRF gives each serializer instance its own fields by deep-copying the declared ones, and
a field deep-copies by running its `__init__` again on deep copies of its arguments
(validators, error messages, regexes). Per payment that was 17 fields rebuilt twice over
(the request's shape and the response's): 0.6-0.7 ms of CPU, the largest cost in DRF's
share of a request (docs/BENCHMARKS.md, issue 13, fourth pass).

A declared field is never bound or used: it is a template. `bind()` and validation only
*assign* attributes on the instance's copy (`field_name`, `parent`, `label`, `source`,
`source_attrs`, a lazily built validator list), so a copy of the template's `__dict__`
serves as well as a rebuilt field (its validator list copied too, being the one list a
caller might append to). Where that does not hold, the field is deep-copied as
DRF does: a field holding other fields (a nested serializer, `ListField.child`, a
relation's `child_relation`: the child's `parent` points at the template), a field class
with its own `__deepcopy__`, and a mutable default or initial value (a caller mutating
what validation returned would change the template)."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers
from rest_framework.fields import Field

_IMMUTABLE_DEFAULTS = (str, int, bytes, bool, type(None), type(serializers.empty))


def field_template_copy(field: Field[Any, Any, Any, Any]) -> Field[Any, Any, Any, Any]:
    """A fresh, unbound copy of a declared field: shallow where that is safe (above)."""
    shallow_safe = (
        type(field).__deepcopy__ is Field.__deepcopy__
        and not isinstance(field, serializers.BaseSerializer)
        and not hasattr(field, "child")
        and not hasattr(field, "child_relation")
        and (callable(field.default) or isinstance(field.default, _IMMUTABLE_DEFAULTS))
        and (callable(field.initial) or isinstance(field.initial, _IMMUTABLE_DEFAULTS))
    )
    if not shallow_safe:
        return copy.deepcopy(field)
    clone = object.__new__(type(field))  # Field.__new__ only records _args/_kwargs: copied below
    state = clone.__dict__
    state.update(field.__dict__)
    if "_validators" in state:  # a list: appending to a copy's must not reach the template
        state["_validators"] = list(state["_validators"])
    return clone


class Serializer(serializers.Serializer[Any]):
    """DRF's Serializer; only the copying of the declared fields differs (module docstring)."""

    def get_fields(self) -> dict[str, Field[Any, Any, Any, Any]]:
        return {name: field_template_copy(field) for name, field in self._declared_fields.items()}
