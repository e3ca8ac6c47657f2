"""The garbage collector of a long-lived web worker, frozen once the application is loaded.

A gunicorn worker holds about 133,000 objects for its whole life, and every collection of
the oldest generation walked them all: 85-92 ms a time, during which the request in hand
waits (bench/bench_request_cpu.py --gc-freeze). `gc.freeze()` moves them into a permanent
generation that collections skip; reference counting still frees them. config/gunicorn.py
names `post_worker_init` as its hook, which runs before the worker's first request.
"""

from __future__ import annotations

import gc
from typing import Any

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


def post_worker_init(worker: Any) -> None:
    """gunicorn's hook: the application is loaded, keep its objects out of every later collection."""
    worker.log.info("gc: %d objects of the loaded application frozen", gc_freeze_after_load())
