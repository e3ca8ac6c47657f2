"""The shapes' field copies (fastpath.shapes): a serializer instance's fields are its
own, the declared templates are never bound or changed, and the copies behave as DRF's
deep copies do, on every request and response shape of the faces."""

from __future__ import annotations

import copy
import inspect
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from rest_framework import serializers

from apikit.shapes import Serializer
from fastpath.shapes import field_copies_shallowly, field_template_copy
from payments.api import serializers as payment_shapes
from webhooks.api import serializers as webhook_shapes


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


def _same(left: object, right: object) -> bool:
    """Equal for the purpose of a field's behaviour: validators by type and settings, lazy
    messages by their text, the rest by value."""
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(_same(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if type(left).__module__.startswith(("django.core.validators", "rest_framework.validators")):
        return type(left) is type(right) and _same(vars(left), vars(right))
    if type(left).__name__ in ("lazy_format", "__proxy__"):
        return str(left) == str(right)
    if hasattr(left, "pattern") and hasattr(right, "pattern"):  # compiled (or lazily compiled) regexes
        return bool(left.pattern == right.pattern and left.flags == right.flags)
    return bool(left == right)


@pytest.mark.parametrize("shape", _shapes(), ids=lambda shape: shape.__qualname__)
def test_fields_are_fresh_copies_equal_to_drfs_and_the_templates_stay_unbound(shape: type[serializers.Serializer[Any]]) -> None:
    first, second = shape(), shape()
    for name, template in shape._declared_fields.items():
        mine, theirs = first.fields[name], second.fields[name]
        assert mine is not template and mine is not theirs
        assert mine.parent is first and theirs.parent is second and mine.field_name == name
        assert template.field_name is None and getattr(template, "parent", None) is None
        # A copy holds what DRF's deep copy, bound the same way, would hold, value by value
        # (but its declaration counter, which orders fields at class creation only).
        rebuilt = copy.deepcopy(template)
        rebuilt.bind(field_name=name, parent=first)
        assert set(vars(mine)) - {"_validators"} == set(vars(rebuilt)) - {"_validators"}
        for attribute in set(vars(mine)) - {"parent", "_args", "_kwargs", "_validators", "_creation_counter", "child", "fields", "_declared_fields"}:
            assert _same(getattr(mine, attribute), getattr(rebuilt, attribute)), (name, attribute)
        assert _same(mine.validators, rebuilt.validators), name


def test_the_plain_fields_of_a_payment_take_the_shallow_path() -> None:
    """The point of the module: the fields of a payment's shapes are not rebuilt (their
    validator objects are the template's), so always deep-copying would fail here."""
    for shape in (payment_shapes.TerminalPaymentCreateIn, payment_shapes.PaymentOut):
        instance = shape()
        for name, template in shape._declared_fields.items():
            assert field_copies_shallowly(template), (shape.__qualname__, name)
            copied = instance.fields[name]
            assert copied.__dict__.get("_validators", []) == template.__dict__.get("_validators", [])
            assert all(a is b for a, b in zip(copied.__dict__.get("_validators", []), template.__dict__.get("_validators", []), strict=True))
            assert copied.error_messages == template.error_messages and copied.error_messages is not template.error_messages


def test_editing_a_copys_containers_reaches_neither_the_template_nor_the_next_request() -> None:
    shape = payment_shapes.ApiKeyCreateIn
    edited = shape()
    edited.fields["principal_type"].choice_strings_to_values["admin"] = "admin"
    edited.fields["principal_type"].error_messages["invalid_choice"] = "changed"
    edited.fields["principal_id"].validators.append(lambda value: None)
    template = shape._declared_fields["principal_type"]
    assert "admin" not in template.choice_strings_to_values and template.error_messages["invalid_choice"] != "changed"
    fresh = shape(data={"principal_type": "admin", "principal_id": "cus_abc"})
    assert not fresh.is_valid() and fresh.errors["principal_type"][0].code == "invalid_choice"
    assert len(fresh.fields["principal_id"].validators) == len(shape._declared_fields["principal_id"].validators)


def test_a_copys_validator_list_is_its_own() -> None:
    template = serializers.IntegerField(max_value=10)
    clone = field_template_copy(template)
    clone.validators.append(lambda value: None)
    assert len(template.validators) == 1 and len(clone.validators) == 2


class _OwnDeepcopy(serializers.CharField):
    deep_copies = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> _OwnDeepcopy:
        type(self).deep_copies += 1
        return super().__deepcopy__(memo)  # type: ignore[no-any-return]


class _Nested(Serializer):
    tags = serializers.ListField(child=serializers.CharField())
    plain_tags = serializers.ListField(child=serializers.CharField(), initial=None)  # only its child forces the deep copy
    inner = payment_shapes.MerchantOut()
    options = serializers.JSONField(default=dict)
    labels = serializers.CharField(default=[])  # a mutable default (no shape of ours has one)
    created_by = serializers.CharField(default=serializers.CreateOnlyDefault("x"))  # a callable instance
    hinted = serializers.CharField(initial=[])  # a mutable initial value
    own = _OwnDeepcopy()
    name = serializers.CharField(max_length=5)


def test_fields_holding_fields_state_or_their_own_copy_are_deep_copied() -> None:
    declared = _Nested._declared_fields
    assert [name for name, field in declared.items() if field_copies_shallowly(field)] == ["options", "name"]
    before = _OwnDeepcopy.deep_copies
    instance = _Nested()
    assert "own" in instance.fields  # fields are built on first access
    assert _OwnDeepcopy.deep_copies == before + 1
    for name in ("tags", "plain_tags"):
        assert instance.fields[name].child is not declared[name].child and instance.fields[name].child.parent is instance.fields[name]
    assert instance.fields["inner"].fields["id"] is not declared["inner"].fields["id"]
    assert instance.fields["options"].default is dict  # a class: DRF calls it, sharing is safe
    assert instance.fields["labels"].default is not declared["labels"].default
    assert instance.fields["created_by"].default is not declared["created_by"].default
    assert instance.fields["hinted"].initial is not declared["hinted"].initial


def test_validation_and_rendering_behave_as_before() -> None:
    shape = payment_shapes.TerminalPaymentCreateIn
    good = shape(data={"customer": "cus_abc", "asset": "JPY", "amount": 100})
    assert good.is_valid(), good.errors
    bad = shape(data={"customer": "cus_abc", "asset": "jpy", "amount": 10.5, "extra": 1})
    assert not bad.is_valid() and set(bad.errors) == {"extra"}
    bad = shape(data={"customer": "cus_abc", "asset": "jpy", "amount": 10.5})
    assert not bad.is_valid() and set(bad.errors) == {"asset", "amount"}
    assert not _Nested(data={"name": "toolong", "tags": []}).is_valid()
    # The templates were not touched by either run: a third instance validates the same way.
    again = shape(data={"customer": "cus_abc", "asset": "JPY", "amount": 100})
    assert again.is_valid() and again.validated_data == good.validated_data
    payment = SimpleNamespace(
        id="pay_1", created=datetime(2026, 11, 24, 12, 0, tzinfo=UTC), status="succeeded", asset_id="JPY", amount=250,
        amount_refunded=0, customer_id="cus_1", merchant_id="mer_1", store_id=None, terminal_id="ter_1", points_earned=2, carbon_grams=125,
        fee=6, net=244,
    )
    rendered = [payment_shapes.PaymentOut(payment).data for _ in range(2)]
    assert rendered[0] == rendered[1] and rendered[0]["object"] == "payment" and rendered[0]["store"] is None
    assert rendered[0]["created"] == "2026-11-24T12:00:00Z" and rendered[0]["amount"] == 250


def test_lazy_validator_messages_are_formatted_at_import() -> None:
    """Copies share validators; an unformatted lazy_format would race between threads."""
    for shape in _shapes():
        for field in shape._declared_fields.values():
            for validator in field.__dict__.get("_validators", ()):
                message = getattr(validator, "message", None)
                if type(message).__name__ == "lazy_format" and issubclass(shape, Serializer):
                    assert message.result is not None, (shape.__qualname__, field)
