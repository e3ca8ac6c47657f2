"""The reconciliation dashboard's daily figures group by the tenant's local day: the same two
payments fall on different days for a tenant in Asia/Tokyo, one in America/New_York and one
in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from payments.services.charges import payment_create
from reconciliation.selectors import dashboard_volume_charts
from tenants.models import Tenant
from tests.factories import CustomerFactory, TerminalFactory, fund


def _set_zone(tenant: Tenant, name: str) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(time_zone=name)
    tenant.time_zone = name
    connection.tenant.time_zone = name  # type: ignore[attr-defined]


@pytest.mark.parametrize(("zone", "early_day", "late_day"), [
    ("UTC", 0, 0),
    ("Asia/Tokyo", 0, 1),  # 03:00 UTC is noon in Tokyo; 15:30 UTC is 00:30 the next day
    ("America/New_York", -1, 0),  # 03:00 UTC is 22:00 the evening before in New York (EST)
])
def test_daily_volume_is_grouped_by_the_tenants_local_day(recon_tenant: Tenant, zone: str, early_day: int, late_day: int) -> None:
    before = recon_tenant.time_zone
    try:
        customer, terminal = CustomerFactory(), TerminalFactory()
        fund(customer, 10_000)
        now = timezone.now()
        base = datetime.combine((now - timedelta(days=5)).date(), datetime.min.time(), tzinfo=UTC)
        for at, amount in ((base + timedelta(hours=3), 222), (base + timedelta(hours=15, minutes=30), 111)):
            with time_machine.travel(at, tick=False):
                payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=amount)
        _set_zone(recon_tenant, zone)
        charts = {chart.slug: chart for chart in dashboard_volume_charts(now=now)}
        volume = charts["volume-jpy"]
        by_label: dict[str, Any] = dict(zip(volume.labels, volume.series[0].values, strict=True))
        expected: dict[str, Decimal] = {}
        for offset, amount in ((early_day, 222), (late_day, 111)):
            label = (base.date() + timedelta(days=offset)).strftime("%m-%d")
            expected[label] = expected.get(label, Decimal(0)) + amount
        assert {label: value for label, value in by_label.items() if value} == expected
        local_today = now.astimezone(ZoneInfo(zone)).date()
        assert volume.labels[-1] == local_today.strftime("%m-%d")  # the axis ends on the tenant's today
    finally:
        recon_tenant.time_zone = before
