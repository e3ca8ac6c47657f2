"""Read selectors for parties and keys."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from wallets.models import ApiKey
from wallets.services.principals import api_key_hash


def api_key_get_active(*, raw_key: str) -> ApiKey | None:
    """The live key row for `raw_key`, or None if unknown, revoked or past its overlap window."""
    now = timezone.now()
    return (
        ApiKey.objects.select_related("customer", "merchant", "terminal__store__merchant", "staff__user")
        .filter(key_hash=api_key_hash(raw_key), revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .first()
    )
