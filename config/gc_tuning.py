"""The garbage collector of a long-lived web worker, set once the application is loaded.

A gunicorn worker holds about 133,000 objects that live as long as it does: modules,
settings, URL patterns, views and serializers, compiled statements. CPython's oldest
generation is collected whenever enough objects have survived into it, and each such
collection walks every one of those objects again: 85-92 ms a time here, during which the
request in hand waits (bench/bench_request_cpu.py --gc-freeze). `gc.freeze()` moves
everything alive at that moment into a permanent generation that collections skip, so
they walk only what requests made since. Nothing is leaked by it: frozen objects are
freed by reference counting as before; only garbage cycles among them would stay, and
there are at most the start-up set's, once.

Django imports the URL configuration, and the views and serializers behind it, on the
first request; they are loaded here first, so that they are frozen too.

Called from gunicorn's `post_worker_init` hook (config/gunicorn.py), after the worker has
imported the application and before its first request.
"""

from __future__ import annotations

import gc

from django.conf import settings
from django.urls import get_resolver


def gc_freeze_after_load() -> int:
    """Load every URL configuration, collect once, then freeze what is left alive;
    returns how many objects were frozen."""
    for urlconf in {settings.ROOT_URLCONF, getattr(settings, "PUBLIC_SCHEMA_URLCONF", None)}:
        if urlconf:
            get_resolver(urlconf).url_patterns  # noqa: B018 - imports the views behind it
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
