"""The admin's date drill-down for big tables, without Django's scan of every row (SELECT
DISTINCT date_trunc): every period between the list's first and last row (MIN and MAX,
two index reads) is offered, so an empty month may be. Same template and links."""

from __future__ import annotations

import calendar
import datetime
from typing import Any

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy as django_date_hierarchy
from django.db.models import Max, Min
from django.utils import formats, timezone
from django.utils.text import capfirst

register = template.Library()


@register.inclusion_tag("admin/date_hierarchy.html")
def tally_date_hierarchy(cl: Any) -> dict[str, Any]:
    if not cl.date_hierarchy:
        return {}
    field = cl.date_hierarchy
    year_field, month_field, day_field = f"{field}__year", f"{field}__month", f"{field}__day"
    year, month, day = cl.params.get(year_field), cl.params.get(month_field), cl.params.get(day_field)
    year, month, day = (v[-1] if isinstance(v, list) else v for v in (year, month, day))
    if year and month and day:
        return dict(django_date_hierarchy(cl) or {})  # one day: no query

    def link(filters: dict[str, Any]) -> str:
        return str(cl.get_query_string(filters, [f"{field}__"]))

    bounds = cl.queryset.aggregate(first=Min(field), last=Max(field))
    first, last = bounds["first"], bounds["last"]
    if first is None or last is None:
        return {"show": False}
    # A DateField (the daily totals' day) is a calendar day already; a DateTimeField an instant.
    first, last = ((timezone.localtime(v) if isinstance(v, datetime.datetime) else datetime.datetime.combine(v, datetime.time.min))
                   for v in (first, last))
    if not year and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month
    if year and month:
        y, m = int(year), int(month)
        days = [datetime.date(y, m, d) for d in range(1, calendar.monthrange(y, m)[1] + 1)]
        days = [d for d in days if first.date() <= d <= last.date()] or days
        back = {"link": link({year_field: y}), "title": str(y)}
        choices = [(link({year_field: y, month_field: m, day_field: d.day}), formats.date_format(d, "MONTH_DAY_FORMAT")) for d in days]
    elif year:
        y = int(year)
        months = [datetime.date(y, m, 1) for m in range(1, 13)]
        months = [d for d in months if (first.year, first.month) <= (d.year, d.month) <= (last.year, last.month)] or months
        back = {"link": link({}), "title": "All dates"}
        choices = [(link({year_field: y, month_field: d.month}), formats.date_format(d, "YEAR_MONTH_FORMAT")) for d in months]
    else:
        back, choices = None, [(link({year_field: str(y)}), str(y)) for y in range(first.year, last.year + 1)]
    return {"show": True, "back": back, "choices": [{"link": url, "title": capfirst(title)} for url, title in choices]}
