"""`manage.py outbox_relay [--schema S]`: run the outbox relay once, in one tenant or in
every active tenant (what the beat sweep does, without Celery): for operators catching up
by hand, and for the relay crash tests."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django_tenants.utils import schema_context

from tenants.selectors import tenant_schemas_active
from webhooks.services.relay import outbox_relay_run


class Command(BaseCommand):
    help = "Publish due outbox events and send due webhook deliveries, once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schema", help="one tenant's schema (default: every active tenant)")

    def handle(self, *args: Any, **options: Any) -> None:
        schemas = [options["schema"]] if options["schema"] else tenant_schemas_active()
        for schema_name in schemas:
            with schema_context(schema_name):
                published = outbox_relay_run(settle=True)  # as beat's runs: the due-work row says what is left
            self.stdout.write(f"{schema_name}: {published} event(s) published")
