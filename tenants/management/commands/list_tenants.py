from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from tenants.models import Tenant


class Command(BaseCommand):
    help = "List tenants with their domains and main currency."

    def handle(self, *args: Any, **options: Any) -> None:
        rows = Tenant.objects.exclude(schema_name="public").filter(is_active=True).prefetch_related("domains")
        self.stdout.write(f"{'schema':<20} {'currency':<9} {'name':<30} domains")
        for tenant in rows:
            domains = ",".join(d.domain for d in tenant.domains.all())
            self.stdout.write(f"{tenant.schema_name:<20} {tenant.main_currency:<9} {tenant.name:<30} {domains}")
