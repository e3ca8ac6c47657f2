"""`make run`: the demo merchant's webhook endpoint, pointed at the local receiver the
Procfile starts (docs/webhook_receiver.py). The secret, shown once, is kept in var/ for
the receiver; a later run reuses it, or rotates it when it is gone or another database's."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from django_tenants.utils import schema_context

from payments.demo import DEMO_SCHEMA
from wallets.models import Merchant
from webhooks.models import WebhookEndpoint, WebhookEndpointStatus
from webhooks.secrets import webhook_endpoint_secrets
from webhooks.services.endpoints import webhook_endpoint_create, webhook_endpoint_secret_rotate, webhook_endpoint_update


def demo_webhook_endpoint_ensure(*, merchant_id: str, url: str, state_file: Path, schema: str = DEMO_SCHEMA) -> dict[str, str]:
    """The demo merchant's endpoint at `url` and its secret: {"endpoint": id, "secret": whsec_...}."""
    saved: dict[str, str] = json.loads(state_file.read_text()) if state_file.exists() else {}
    with schema_context(schema):
        merchant = Merchant.objects.get(pk=merchant_id)
        endpoint = WebhookEndpoint.objects.filter(merchant=merchant, url=url).first()
        if endpoint is None:
            endpoint, secret = webhook_endpoint_create(merchant=merchant, url=url, enabled_events=["*"], description="make run demo receiver")
        elif saved.get("endpoint") == endpoint.id and saved.get("secret") == webhook_endpoint_secrets(endpoint=endpoint).current:
            secret = saved["secret"]
        else:
            endpoint, secret = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(0))
        if endpoint.status != WebhookEndpointStatus.ENABLED:
            webhook_endpoint_update(endpoint=endpoint, status=WebhookEndpointStatus.ENABLED)
    state = {"endpoint": endpoint.id, "secret": secret}
    state_file.parent.mkdir(exist_ok=True)
    state_file.write_text(json.dumps(state, indent=2))
    state_file.chmod(0o600)
    return state

