from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_tenants.utils import schema_context

from tenants.models import Tenant
from wallets.services.principals import api_key_create, staff_member_get_or_create
from wallets.services.roles import ROLES, staff_role_set


class Command(BaseCommand):
    help = (
        "Create (or reuse) a staff member in a tenant and mint an ak_ key for it. The key acts with the login's roles,"
        " read at each request; --role puts the login in one. The key is the last line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="Tenant schema name")
        parser.add_argument("--username", required=True)
        parser.add_argument("--role", choices=ROLES, help="Put the login in this role (replacing its others)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(schema_name=options["tenant"], is_active=True).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}")
        with schema_context(tenant.schema_name):
            staff = staff_member_get_or_create(username=options["username"])
            if options["role"]:
                staff_role_set(staff=staff, role=options["role"])
            api_key, raw_key = api_key_create(principal=staff)
            roles = staff.user.groups.values_list("name", flat=True)
            powers = "superuser" if staff.user.is_superuser else ", ".join(roles) or "no role: every admin-face action is refused"
        self.stdout.write(f"staff {staff.id} ({options['username']}; {powers}) key {api_key.id}; shown once:")
        self.stdout.write(raw_key)
