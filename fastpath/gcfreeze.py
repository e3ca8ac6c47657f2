"""A gunicorn worker's garbage collector, frozen once the application is loaded (the hook
config/gunicorn.py names): the ~133,000 objects a worker holds for life were walked by every
collection of the oldest generation, 85-92 ms during which the request in hand waited
(bench/bench_request_cpu.py --gc-freeze). Reference counting still frees frozen objects.
"""

from __future__ import annotations

import gc
from typing import Any

from django.conf import settings
from django.urls import get_resolver


def gc_freeze_after_load() -> int:
    """Load every URL configuration (and the views behind it), collect, freeze; how many objects were frozen."""
    for urlconf in {settings.ROOT_URLCONF, getattr(settings, "PUBLIC_SCHEMA_URLCONF", None)}:
        if urlconf:
            get_resolver(urlconf).url_patterns  # noqa: B018 - imports the views behind it
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def post_worker_init(worker: Any) -> None:
    worker.log.info("gc: %d objects of the loaded application frozen", gc_freeze_after_load())
