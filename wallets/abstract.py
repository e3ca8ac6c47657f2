"""The abstract base of the models whose rows are API objects: an opaque type-prefixed id
(`cus_...`, wallets.ids) and the time the row was created."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import models
from django.db.models.fields import NOT_PROVIDED

from wallets import ids

if TYPE_CHECKING:  # Django's fields take no type parameters at run time; the stubs' do
    _CharField = models.CharField[str | int, str]
else:
    _CharField = models.CharField


class PrefixedIdField(_CharField):
    """The primary key of a PrefixedIdModel: its default is the id factory its concrete model
    names. Migrations see it as the plain CharField it is, so nothing is migrated."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"max_length": ids.ID_MAX_LENGTH, "primary_key": True, "editable": False, **kwargs})

    def contribute_to_class(self, cls: type[models.Model], name: str, private_only: bool = False) -> None:
        if self.default is NOT_PROVIDED and not cls._meta.abstract:
            self.default = cls.new_id  # type: ignore[attr-defined]
        super().contribute_to_class(cls, name, private_only)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.CharField", args, kwargs


class PrefixedIdModel(models.Model):
    """A row with an id such as `cus_...`, made by the id factory the class statement names
    (`class Customer(PrefixedIdModel, new_id=ids.new_customer_id)`, which its migrations
    reference), and `created`, set on insert. Shown as `name (id)`, or its id."""

    new_id: ClassVar[Callable[[], str]]

    id = PrefixedIdField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    def __init_subclass__(cls, new_id: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if new_id is not None:
            cls.new_id = new_id  # read by PrefixedIdField when the model is built

    def __str__(self) -> str:
        name = getattr(self, "name", None)
        return str(self.id) if name is None else f"{name} ({self.id})"
