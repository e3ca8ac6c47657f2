"""From a tenant's GatewayAccount row to a ready adapter (credentials unsealed here only)."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import connection

from payments.gateways.base import Gateway, GatewayNotConfigured
from payments.gateways.credentials import credential_unseal
from payments.models import GatewayAccount


def _schema() -> str:
    return str(getattr(connection, "schema_name", "public"))


def gateway_secret_key(*, account: GatewayAccount) -> str:
    return credential_unseal(sealed=bytes(account.secret_key_sealed), schema=_schema(), gateway=account.gateway, field="secret_key")


def gateway_webhook_secrets(*, account: GatewayAccount) -> list[str]:
    raw = credential_unseal(sealed=bytes(account.webhook_secrets_sealed), schema=_schema(), gateway=account.gateway, field="webhook_secrets")
    return [str(s) for s in json.loads(raw)]


def gateway_build(*, account: GatewayAccount) -> Gateway:
    """The adapter for `account`, with the inline-call timeout of settings.TALLY_PSP_TIMEOUT_SECONDS."""
    timeout = float(settings.TALLY_PSP_TIMEOUT_SECONDS)
    if account.gateway == "simulator":
        from payments.gateways.simulator import SimulatorGateway

        return SimulatorGateway(api_base=account.api_base, secret_key=gateway_secret_key(account=account), timeout=timeout)
    if account.gateway == "stripe":
        from payments.gateways.stripe_gateway import StripeGateway

        return StripeGateway(api_base=account.api_base, secret_key=gateway_secret_key(account=account), timeout=timeout)
    raise GatewayNotConfigured(f"unknown gateway {account.gateway!r}")
