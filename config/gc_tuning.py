"""The garbage collector of a long-lived web worker, set once the application is loaded.

A gunicorn worker holds about 133,000 objects for its whole life, and every collection of
the oldest generation walked them all: 85-92 ms a time, during which the request in hand
waits (bench/bench_request_cpu.py --gc-freeze). `gc.freeze()` moves them into a permanent
generation that collections skip; reference counting still frees them. Called from
gunicorn's `post_worker_init` hook (config/gunicorn.py), before the first request.
"""

from __future__ import annotations

import gc

from django.conf import settings
from django.urls import get_resolver


def gc_freeze_after_load() -> int:
    """Load every URL configuration (and the views behind it), collect once, freeze; returns how many objects were frozen."""
    for urlconf in {settings.ROOT_URLCONF, getattr(settings, "PUBLIC_SCHEMA_URLCONF", None)}:
        if urlconf:
            get_resolver(urlconf).url_patterns  # noqa: B018 - imports the views behind it
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
