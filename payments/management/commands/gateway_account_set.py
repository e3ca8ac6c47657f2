"""Choose a tenant's card gateway and store its credentials (sealed at rest).

    TALLY_PSP_SECRET_KEY=sk_live_... TALLY_PSP_WEBHOOK_SECRETS=whsec_new,whsec_old \\
        python manage.py gateway_account_set --schema acme --gateway stripe

Secrets come from the environment, never the command line (shell history, `ps`).
Several webhook secrets (comma-separated) are all accepted, for rotation.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_tenants.utils import schema_context, schema_exists

from payments.gateways.stripe_gateway import STRIPE_API_BASE
from payments.services.topups import gateway_account_set
from wallets.errors import TallyError


class Command(BaseCommand):
    help = "Set a tenant's card gateway (simulator or stripe); secrets from TALLY_PSP_SECRET_KEY and TALLY_PSP_WEBHOOK_SECRETS."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--schema", required=True)
        parser.add_argument("--gateway", required=True, choices=["simulator", "stripe"])
        parser.add_argument("--api-base", default=None, help="The PSP's API root (default: Stripe's; required for the simulator)")
        parser.add_argument("--inactive", action="store_true", help="Store the account without making it the one top-ups use")

    def handle(self, *args: Any, **options: Any) -> None:
        if not schema_exists(options["schema"]):
            raise CommandError(f"no schema {options['schema']!r}")
        api_base = options["api_base"] or (STRIPE_API_BASE if options["gateway"] == "stripe" else None)
        if not api_base:
            raise CommandError("--api-base is required for the simulator")
        secret_key = os.environ.get("TALLY_PSP_SECRET_KEY", "")
        webhook_secrets = [s.strip() for s in os.environ.get("TALLY_PSP_WEBHOOK_SECRETS", "").split(",") if s.strip()]
        with schema_context(options["schema"]):
            try:
                account = gateway_account_set(
                    gateway=options["gateway"], api_base=api_base, secret_key=secret_key, webhook_secrets=webhook_secrets,
                    active=not options["inactive"],
                )
            except TallyError as exc:
                raise CommandError(exc.message) from exc
        state = "active" if account.active else "inactive"
        self.stdout.write(f"{options['schema']}: {account.gateway} gateway at {account.api_base} ({state}, {len(webhook_secrets)} webhook secrets)")
