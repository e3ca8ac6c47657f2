from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_tenants.utils import schema_exists

from tenants.models import Domain
from tenants.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant: schema, domain, main currency, standard assets and system accounts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schema", required=True)
        parser.add_argument("--domain", required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument("--currency", required=True, help="Main currency code, e.g. JPY")
        parser.add_argument("--exponent", type=int, default=None, help="Minor-unit exponent (default: 0 for JPY, else 2)")

    def handle(self, *args: Any, **options: Any) -> None:
        schema = options["schema"]
        if schema_exists(schema):
            raise CommandError(f"schema {schema!r} already exists")
        if Domain.objects.filter(domain=options["domain"]).exists():
            raise CommandError(f"domain {options['domain']!r} is taken")
        currency = options["currency"].upper()
        exponent = options["exponent"] if options["exponent"] is not None else (0 if currency in {"JPY", "KRW", "VND", "CLP", "ISK"} else 2)
        started = time.perf_counter()
        try:
            tenant = tenant_create(
                schema_name=schema, domain=options["domain"], name=options["name"], main_currency=currency, currency_exponent=exponent
            )
        except Exception as exc:  # a validation error from the model is the operator's input
            raise CommandError(str(exc)) from exc
        elapsed = time.perf_counter() - started
        self.stdout.write(f"created tenant {tenant.schema_name} at {options['domain']} ({currency}, exponent {exponent}) in {elapsed:.2f}s")
