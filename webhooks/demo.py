"""`make run`: the demo merchant's webhook endpoint, pointed at the local receiver the
Procfile starts (docs/webhook_receiver.py). The secret, shown once, is kept in var/ for
the receiver; a later run reuses it, or rotates it when it is gone or another database's.

Whatever state the demo data is in (an API run or schemathesis may have filled the
merchant's endpoints, repointed or disabled the demo's), seeding repairs it and says what
it did: it never stops `make run`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django_tenants.utils import schema_context

from payments.demo import DEMO_SCHEMA
from wallets.models import Merchant
from wallets.sealing import UNOPENED
from webhooks.errors import WebhookEndpointLimitReached
from webhooks.models import WebhookEndpoint, WebhookEndpointStatus
from webhooks.secrets import WebhookSecretUnavailable, webhook_endpoint_secrets
from webhooks.services.endpoints import webhook_endpoint_create, webhook_endpoint_secret_rotate, webhook_endpoint_update

DEMO_DESCRIPTION = "make run demo receiver"


def demo_webhook_endpoint_ensure(
    *, merchant_id: str, url: str, state_file: Path, schema: str = DEMO_SCHEMA, say: Callable[[str], None] = print
) -> dict[str, str]:
    """The demo merchant's endpoint at `url`, enabled, for every event, and its secret:
    {"endpoint": id, "secret": whsec_...}. `say` reports each repair.

    The endpoint is, in this order: one already at `url` (the one the state file names
    first); else the state file's endpoint, repointed (its URL was changed); else a new
    one, when the merchant has room; else, at the endpoint limit, the oldest endpoint the
    demo made, or failing that the merchant's oldest, repointed at `url`."""
    saved = _saved_state(state_file=state_file, say=say)
    with schema_context(schema), transaction.atomic():
        merchant = Merchant.objects.get(pk=merchant_id)
        endpoint = _demo_endpoint(merchant=merchant, url=url, saved_id=saved.get("endpoint", ""), say=say)
        if endpoint.status != WebhookEndpointStatus.ENABLED:
            endpoint = webhook_endpoint_update(endpoint=endpoint, status=WebhookEndpointStatus.ENABLED)
            say(f"demo webhook endpoint {endpoint.pk}: was disabled, enabled again")
        if sorted(endpoint.enabled_events) != ["*"]:
            endpoint = webhook_endpoint_update(endpoint=endpoint, enabled_events=["*"])
            say(f"demo webhook endpoint {endpoint.pk}: subscribed to every event again")
        if saved.get("endpoint") == endpoint.pk and saved.get("secret") == _stored_secret(endpoint=endpoint, say=say):
            secret = saved["secret"]
        else:
            endpoint, secret = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(0))
    state = {"endpoint": endpoint.pk, "secret": secret}
    state_file.parent.mkdir(exist_ok=True)
    state_file.write_text(json.dumps(state, indent=2))
    state_file.chmod(0o600)
    return state


def _saved_state(*, state_file: Path, say: Callable[[str], None]) -> dict[str, str]:
    """What the last run saved ({} when nothing usable: the secret is then rotated)."""
    if not state_file.exists():
        return {}
    try:
        saved = json.loads(state_file.read_text())
    except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
        saved = None
    if not isinstance(saved, dict):
        say(f"{state_file}: unreadable, made anew (the demo endpoint gets a new secret)")
        return {}
    return {k: v for k, v in saved.items() if isinstance(v, str)}


def _stored_secret(*, endpoint: WebhookEndpoint, say: Callable[[str], None]) -> str | None:
    """The endpoint's current secret, or None if it no longer opens (the sealing keys
    changed: var/sealing_keys deleted, TALLY_SEALING_KEYS changed): it is then rotated."""
    try:
        return webhook_endpoint_secrets(endpoint=endpoint).current
    except (*UNOPENED, WebhookSecretUnavailable) as exc:
        say(f"demo webhook endpoint {endpoint.pk}: its secret does not open under the current sealing keys "
            f"({type(exc).__name__}); it gets a new one")
        return None


def _demo_endpoint(*, merchant: Merchant, url: str, saved_id: str, say: Callable[[str], None]) -> WebhookEndpoint:
    """The endpoint the demo receiver gets (see demo_webhook_endpoint_ensure), its URL `url`."""
    endpoints = WebhookEndpoint.objects.filter(merchant=merchant)
    at_url = sorted(endpoints.filter(url=url), key=lambda e: (e.pk != saved_id, e.status != WebhookEndpointStatus.ENABLED, e.created))
    if at_url:
        return at_url[0]
    saved = endpoints.filter(pk=saved_id).first() if saved_id else None
    if saved is None:
        try:
            endpoint, _ = webhook_endpoint_create(merchant=merchant, url=url, enabled_events=["*"], description=DEMO_DESCRIPTION)
            return endpoint
        except WebhookEndpointLimitReached:
            pass  # the merchant's endpoints are all taken (an API or fuzzing run): reuse one
        saved = (
            endpoints.filter(description=DEMO_DESCRIPTION).order_by("created", "id").first()
            or endpoints.order_by("created", "id").first()
        )
        assert saved is not None  # at the limit, the merchant has endpoints
    say(f"demo webhook endpoint {saved.pk}: pointed at {url} again (it was {saved.url})")
    return webhook_endpoint_update(endpoint=saved, url=url, enabled_events=["*"])
