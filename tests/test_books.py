"""The books' calendar and the tenant's time zone (wallets/books.py, Tenant.time_zone)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError

from tenants.models import time_zone_validate
from wallets.books import month_bounds


@pytest.mark.parametrize(("zone", "month", "start_utc", "hours"), [
    ("Europe/Berlin", date(2026, 10, 15), datetime(2026, 9, 30, 22, tzinfo=UTC), 31 * 24 + 1),  # summer time ends inside
    ("Europe/Berlin", date(2026, 3, 1), datetime(2026, 2, 28, 23, tzinfo=UTC), 31 * 24 - 1),  # summer time begins inside
    ("America/New_York", date(2026, 11, 30), datetime(2026, 11, 1, 4, tzinfo=UTC), 30 * 24 + 1),
    ("Asia/Tokyo", date(2026, 12, 31), datetime(2026, 11, 30, 15, tzinfo=UTC), 31 * 24),
    ("UTC", date(2028, 2, 29), datetime(2028, 2, 1, tzinfo=UTC), 29 * 24),
])
def test_a_month_begins_at_local_midnight_and_lasts_its_local_hours(zone: str, month: date, start_utc: datetime, hours: int) -> None:
    start, end = month_bounds(month=month, zone=ZoneInfo(zone))
    assert start == start_utc
    assert (end - start).total_seconds() == hours * 3600
    assert month_bounds(month=end.astimezone(ZoneInfo(zone)).date(), zone=ZoneInfo(zone))[0] == end  # months tile, no gap


@pytest.mark.parametrize("name", ["Europe/Berln", "", "../etc/passwd", "UTC+9",
                                  # files of the tz database that name no place's civil time
                                  "right/UTC", "right/Asia/Tokyo", "posix/Europe/Berlin", "posixrules", "localtime", "Factory"])
def test_a_time_zone_that_is_not_an_iana_name_is_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        time_zone_validate(name)


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "Asia/Tokyo", "America/New_York", "Etc/UTC"])
def test_an_iana_time_zone_name_is_accepted(name: str) -> None:
    time_zone_validate(name)
