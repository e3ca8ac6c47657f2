"""Building blocks of every app's admin.py: read-only bases, a paginator that never counts
a big table, exact id search, money in the asset's units, links between objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import BaseModelAdmin
from django.contrib.admin.utils import flatten, quote
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from wallets.models import Asset
from wallets.money import money_format

COUNT_CAP = 10_000


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Never an unbounded COUNT(*): an unfiltered list of a big table takes PostgreSQL's
    estimate (pg_class.reltuples); a filtered one counts at most COUNT_CAP + 1 rows."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        if not queryset.query.where:
            with connection.cursor() as cursor:  # the table in the current schema; -1 or 0 when never analysed
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [queryset.model._meta.db_table])
                row = cursor.fetchone()
            if row and row[0] is not None and row[0] > COUNT_CAP:
                return int(row[0])
        return int(queryset[: COUNT_CAP + 1].count())


class TallyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Base of every tenant admin page: bounded counts, and exact id search: `id_search`
    maps an id prefix ("pay") to the column it names, so `pay_...` is one index lookup."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # "Show counts" would COUNT(*) every filter choice over the table
    change_list_template = "admin/tally/change_list.html"  # the date drill-down without a scan
    list_per_page = 50
    id_search: dict[str, str] = {}

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        prefix = term.split("_", 1)[0] if "_" in term else ""
        if prefix in self.id_search:
            return queryset.filter(**{self.id_search[prefix]: term}), False
        return super().get_search_results(request, queryset, search_term)


class ReadOnlyMixin(BaseModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete in the admin: the rows change only through services (an
    inline on a read-only page gets no extra rows). Every field shown is read-only (`fields`
    may name the admin's own display methods)."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return flatten(self.fields) if self.fields else super().get_readonly_fields(request, obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(ReadOnlyMixin, TallyAdmin):
    """Rows that change only through services (the ledger, payments, keys, the audit log)."""


def money(amount: int | None, asset: Asset | None) -> str:
    """Minor units in the asset's units (wallets.money.money_format)."""
    if amount is None or asset is None:
        return "-"
    return money_format(amount=amount, code=asset.code, kind=asset.kind, exponent=asset.exponent)


def money_column(field: str, *, description: str | None = None) -> Callable[[Any], str]:
    """A list/detail column showing `field` (minor units) in the units of `obj.asset`."""

    def column(obj: Any) -> str:
        return money(getattr(obj, field), obj.asset)

    column.short_description = description or field.replace("_", " ")  # type: ignore[attr-defined]
    column.admin_order_field = field  # type: ignore[attr-defined]
    return column


_PK_PLACEHOLDER = "__tally_pk__"
_change_url_templates: dict[str, str | None] = {}


def admin_url(obj: Model | None) -> str | None:
    """`obj`'s admin page; one reverse() per model and process (a list renders hundreds of links)."""
    if obj is None:
        return None
    name = f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change"
    if name not in _change_url_templates:
        try:
            _change_url_templates[name] = reverse(name, args=[_PK_PLACEHOLDER])
        except NoReverseMatch:
            _change_url_templates[name] = None
    template = _change_url_templates[name]
    return template.replace(_PK_PLACEHOLDER, quote(str(obj.pk))) if template is not None else None


def link(obj: Model | None, label: object = None) -> str:
    """A link to `obj`'s admin page (its text: `label`, else its id)."""
    if obj is None:
        return "-"
    url = admin_url(obj)
    text = label if label is not None else obj.pk
    return format_html('<a href="{}">{}</a>', url, text) if url else str(text)


def link_to_list(model: type[Model], label: str, **filters: object) -> str:
    """A link to `model`'s list filtered by `filters` (e.g. refunds of one payment)."""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return format_html('<a href="{}?{}">{}</a>', url, query, label)


def list_link_column(model: type[Model], label: str, field: str, *, description: str | None = None, **filters: object) -> Callable[[Any], str]:
    """A column linking to `model`'s list of the rows whose `field` is this object (and `filters`)."""

    def column(obj: Any) -> str:
        return link_to_list(model, label, **filters, **{field: obj.pk})

    column.short_description = description or label  # type: ignore[attr-defined]
    return column


def link_column(field: str) -> Callable[[Any], str]:
    """A column linking to the object in `obj.<field>` (a foreign key)."""

    def column(obj: Any) -> str:
        return link(getattr(obj, field))

    column.short_description = field.replace("_", " ")  # type: ignore[attr-defined]
    return column
