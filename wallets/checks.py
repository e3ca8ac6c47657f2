"""System checks of the sealing key ring (wallets/sealing.py)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core import checks

from wallets.sealing import KEY_GENERATE_HINT, SealingRingInvalid, sealing_ring_parse

SEALING_TAG = "tally_sealing"
logger = logging.getLogger("tally.sealing")


@checks.register(SEALING_TAG)
def sealing_ring_check(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """A missing or malformed TALLY_SEALING_KEYS is an error: nothing sealed could be opened."""
    entries = getattr(settings, "TALLY_SEALING_KEYS", None) or []
    legacy = str(getattr(settings, "TALLY_SEALING_LEGACY_SECRET_KEY", "") or "")
    try:
        sealing_ring_parse(list(entries), legacy_secret_key=legacy)
    except SealingRingInvalid as exc:
        return [checks.Error(str(exc), hint=KEY_GENERATE_HINT, id="tally.E001")]
    if legacy:
        return [
            checks.Warning(
                "TALLY_SEALING_LEGACY_SECRET_KEY is set: values sealed by an older release open with it",
                hint="run `manage.py secrets_reseal`, then unset it",
                id="tally.W001",
            )
        ]
    return []


def sealing_ring_enforce() -> None:
    """Refuse to serve without a usable ring (gunicorn and Celery do not run system checks),
    and log its warnings (the legacy key still set) where an operator sees them: at start."""
    from django.core.exceptions import ImproperlyConfigured

    messages = checks.run_checks(tags=[SEALING_TAG])
    for message in messages:
        if not message.is_serious():
            logger.warning("%s: %s (%s)", message.id, message.msg, message.hint)
    errors = [m for m in messages if m.is_serious()]
    if errors:
        raise ImproperlyConfigured("; ".join(f"{m.msg} ({m.hint})" for m in errors))
