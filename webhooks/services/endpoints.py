"""Write services for merchant webhook endpoints: registration, changes, secret rotation."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from payments.relaykick import outbox_relay_kick_on_commit
from wallets import ids
from wallets.models import Merchant
from webhooks.errors import WebhookEndpointInvalid, WebhookEndpointLimitReached, WebhookUrlNotAllowed
from webhooks.locks import merchant_lock, webhook_endpoint_lock
from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpoint, WebhookEndpointStatus
from webhooks.secrets import webhook_endpoint_secrets, webhook_endpoint_secrets_assign
from webhooks.targets import webhook_target_resolve

SECRET_PREFIX = "whsec_"  # noqa: S105 - a visible prefix, not a secret
SECRET_RANDOM_LENGTH = 40  # 62**40 ~ 2**238
MAX_ENDPOINTS_PER_MERCHANT = 16
MAX_EVENT_TYPES = 50
EVENT_TYPE_RE = re.compile(r"^(\*|[a-z][a-z_]{0,40}(\.[a-z][a-z_]{0,40}){0,3})$")
MAX_SECRET_OVERLAP = timedelta(days=7)
MAX_ENDPOINT_CONCURRENCY = 64


def _new_secret() -> str:
    return SECRET_PREFIX + ids.random_token(SECRET_RANDOM_LENGTH)


def _url_check(url: str) -> str:
    """Refuse a URL deliveries must never reach, or whose name does not resolve now, with one
    answer (docs/WEBHOOKS.md "One refusal at registration"): it must not map our internal DNS."""
    try:
        webhook_target_resolve(url=url)
    except WebhookEndpointInvalid:
        raise WebhookUrlNotAllowed() from None
    return url


def _events_check(events: list[str]) -> list[str]:
    if not events or len(events) > MAX_EVENT_TYPES or not all(isinstance(e, str) and EVENT_TYPE_RE.match(e) for e in events):
        raise WebhookEndpointInvalid("enabled_events must list event types such as payment.succeeded, or *", param="enabled_events")
    return sorted(set(events))


@transaction.atomic
def webhook_endpoint_create(*, merchant: Merchant, url: str, enabled_events: list[str], description: str = "") -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; return it and its signing secret (shown once, stored sealed).
    Locks: the merchant's row, so two registrations cannot both pass the limit."""
    merchant_lock(merchant_id=merchant.pk)
    if WebhookEndpoint.objects.filter(merchant=merchant).count() >= MAX_ENDPOINTS_PER_MERCHANT:
        raise WebhookEndpointLimitReached(f"at most {MAX_ENDPOINTS_PER_MERCHANT} webhook endpoints per merchant", param=None)
    secret = _new_secret()
    endpoint = WebhookEndpoint(
        merchant=merchant, url=_url_check(url), enabled_events=_events_check(enabled_events), description=description,
        enabled_at=timezone.now(),
    )
    webhook_endpoint_secrets_assign(endpoint=endpoint, current=secret, previous="")
    endpoint.save(force_insert=True)
    return endpoint, secret


@transaction.atomic
def webhook_endpoint_update(
    *,
    endpoint: WebhookEndpoint,
    url: str | None = None,
    enabled_events: list[str] | None = None,
    description: str | None = None,
    status: str | None = None,
) -> WebhookEndpoint:
    """Change an endpoint. Enabling a disabled one records `enabled_at`, makes what waited
    meanwhile due (`_waiting_deliveries_resume`) and marks the relay due in this transaction.

    Locks: with `status`, the endpoint's row (so no claim leases meanwhile), then some of its pending delivery rows."""
    fields: list[str] = []
    resumed = False
    if status is not None:
        if status not in WebhookEndpointStatus.values:
            raise WebhookEndpointInvalid("status must be enabled or disabled", param="status")
        locked = webhook_endpoint_lock(endpoint_id=endpoint.pk)
        resumed = locked.status != WebhookEndpointStatus.ENABLED and status == WebhookEndpointStatus.ENABLED
    if url is not None:
        endpoint.url = _url_check(url)
        fields.append("url")
    if enabled_events is not None:
        endpoint.enabled_events = _events_check(enabled_events)
        fields.append("enabled_events")
    if description is not None:
        endpoint.description = description
        fields.append("description")
    if status is not None:
        endpoint.status = status
        endpoint.disabled_reason = ""  # enabled again, or disabled by hand: the old reason no longer applies
        fields += ["status", "disabled_reason"]
    if resumed:
        endpoint.enabled_at = timezone.now()
        fields.append("enabled_at")
    if fields:
        endpoint.save(update_fields=[*fields, "updated"])
    if resumed:
        _waiting_deliveries_resume(endpoint=endpoint, now=endpoint.enabled_at or timezone.now())
    if status == WebhookEndpointStatus.ENABLED:
        outbox_relay_kick_on_commit()  # marks the relay due in this transaction, kicks it after
    return endpoint


RESUME_BATCH = 500


def _waiting_deliveries_resume(*, endpoint: WebhookEndpoint, now: datetime) -> None:
    """An endpoint enabled again: the deliveries that were waiting for a retry (a handful; the
    others are due since made) are made due now, in batches (docs/WEBHOOKS.md "No event
    dropped"). One still leased is left to its claim.

    Locks: those delivery rows, after the endpoint's row (the caller's)."""
    retrying = WebhookDelivery.objects.filter(
        endpoint=endpoint, status=WebhookDeliveryStatus.PENDING, next_attempt_at__gt=now, give_up_at__gt=now,
    ).filter(Q(leased_until__isnull=True) | Q(leased_until__lte=now))
    while batch := list(retrying.order_by("next_attempt_at").values_list("pk", flat=True)[:RESUME_BATCH]):
        WebhookDelivery.objects.filter(pk__in=batch).update(next_attempt_at=now, leased_until=None)


@transaction.atomic
def webhook_endpoint_secret_rotate(*, endpoint: WebhookEndpoint, overlap: timedelta = timedelta(hours=24)) -> tuple[WebhookEndpoint, str]:
    """A new signing secret now; the current one keeps signing for `overlap` (at most 7 days).
    Locks: the endpoint's row (webhook_endpoint_lock)."""
    if overlap < timedelta(0) or overlap > MAX_SECRET_OVERLAP:
        raise WebhookEndpointInvalid("overlap must be between 0 and 7 days", param="overlap_seconds")
    locked = webhook_endpoint_lock(endpoint_id=endpoint.pk)
    secret = _new_secret()
    previous = webhook_endpoint_secrets(endpoint=locked).current if overlap > timedelta(0) else ""
    fields = webhook_endpoint_secrets_assign(endpoint=locked, current=secret, previous=previous)
    locked.previous_secret_expires_at = timezone.now() + overlap if overlap > timedelta(0) else None
    locked.save(update_fields=[*fields, "previous_secret_expires_at", "updated"])
    return locked, secret


def webhook_endpoint_signing_secrets(*, endpoint: WebhookEndpoint, now: datetime | None = None) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and the previous inside its overlap."""
    now = now or timezone.now()
    stored = webhook_endpoint_secrets(endpoint=endpoint)
    secrets = [stored.current]
    if stored.previous and endpoint.previous_secret_expires_at and endpoint.previous_secret_expires_at > now:
        secrets.append(stored.previous)
    return secrets


@transaction.atomic
def webhook_endpoint_concurrency_set(*, endpoint: WebhookEndpoint, max_concurrency: int | None) -> WebhookEndpoint:
    """The endpoint's cap on deliveries in flight across every worker (None: the default); the next claim reads it.
    Locks: the endpoint's row (webhook_endpoint_lock)."""
    if max_concurrency is not None and not 1 <= max_concurrency <= MAX_ENDPOINT_CONCURRENCY:
        raise WebhookEndpointInvalid(f"max_concurrency must be between 1 and {MAX_ENDPOINT_CONCURRENCY}", param="max_concurrency")
    locked = webhook_endpoint_lock(endpoint_id=endpoint.pk)
    locked.max_concurrency = max_concurrency
    locked.save(update_fields=["max_concurrency", "updated"])
    endpoint.max_concurrency = max_concurrency
    return locked
