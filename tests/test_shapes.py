"""The shapes' field copies (payments.api.shapes): a serializer instance's fields are its
own, the declared templates are never bound or changed, and the copies behave as DRF's
deep copies do, on every request and response shape of the faces."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
from rest_framework import serializers

from payments.api import serializers as payment_shapes
from payments.api.shapes import Serializer, field_template_copy
from webhooks.api import serializers as webhook_shapes

_BOUND = {"field_name", "parent", "label", "source", "source_attrs", "_validators"}


def _shapes() -> list[type[Serializer]]:
    found = {
        shape
        for module in (payment_shapes, webhook_shapes)
        for _, shape in inspect.getmembers(module, inspect.isclass)
        if issubclass(shape, serializers.Serializer) and shape._declared_fields
    }
    return sorted(found, key=lambda shape: shape.__qualname__)


def test_every_shape_of_the_faces_uses_the_shallow_copying_base() -> None:
    plain = [shape.__qualname__ for shape in _shapes() if not issubclass(shape, Serializer)]
    # The list shapes built by list_serializer() are documentation only (OpenAPI).
    assert [name for name in plain if not name.endswith("List")] == []


@pytest.mark.parametrize("shape", _shapes(), ids=lambda shape: shape.__qualname__)
def test_fields_are_fresh_copies_and_the_templates_stay_unbound(shape: type[serializers.Serializer[Any]]) -> None:
    first, second = shape(), shape()
    for name, template in shape._declared_fields.items():
        mine, theirs = first.fields[name], second.fields[name]
        assert mine is not template and mine is not theirs
        assert mine.parent is first and theirs.parent is second and mine.field_name == name
        assert template.field_name is None and getattr(template, "parent", None) is None
        # A copy holds what DRF's deep copy would hold, bound state aside.
        rebuilt = copy.deepcopy(template)
        rebuilt.bind(field_name=name, parent=first)
        assert set(vars(mine)) == set(vars(rebuilt))
        for attribute in set(vars(mine)) - _BOUND - {"_args", "_kwargs", "error_messages", "validators", "regex"}:
            assert type(getattr(mine, attribute)) is type(getattr(rebuilt, attribute)), (name, attribute)
        assert [type(v) for v in mine.validators] == [type(v) for v in rebuilt.validators]


def test_a_copys_validator_list_is_its_own() -> None:
    template = serializers.IntegerField(max_value=10)
    clone = field_template_copy(template)
    clone.validators.append(lambda value: None)
    assert len(template.validators) == 1 and len(clone.validators) == 2


class _Nested(Serializer):
    tags = serializers.ListField(child=serializers.CharField())
    inner = payment_shapes.MerchantOut()
    options = serializers.JSONField(default=dict)
    labels = serializers.CharField(default=[])  # a mutable default (no shape of ours has one)
    name = serializers.CharField()


def test_fields_holding_fields_or_mutable_defaults_are_deep_copied() -> None:
    instance = _Nested()
    tags, inner, options, labels, name = (instance.fields[n] for n in ("tags", "inner", "options", "labels", "name"))
    template_tags = _Nested._declared_fields["tags"]
    assert tags.child is not template_tags.child and tags.child.parent is tags  # deep: the child follows its copy
    assert inner.fields["id"] is not _Nested._declared_fields["inner"].fields["id"]
    assert options.default is dict  # callable: shared safely
    assert labels.default is not _Nested._declared_fields["labels"].default  # deep copied
    assert type(name).__deepcopy__ is serializers.Field.__deepcopy__


def test_validation_and_rendering_behave_as_before() -> None:
    shape = payment_shapes.TerminalPaymentCreateIn
    good = shape(data={"customer": "cus_abc", "asset": "JPY", "amount": 100})
    assert good.is_valid(), good.errors
    bad = shape(data={"customer": "cus_abc", "asset": "jpy", "amount": 10.5, "extra": 1})
    assert not bad.is_valid() and set(bad.errors) == {"extra"}
    bad = shape(data={"customer": "cus_abc", "asset": "jpy", "amount": 10.5})
    assert not bad.is_valid() and set(bad.errors) == {"asset", "amount"}
    # The templates were not touched by either run: a third instance validates the same way.
    again = shape(data={"customer": "cus_abc", "asset": "JPY", "amount": 100})
    assert again.is_valid() and again.validated_data == good.validated_data
