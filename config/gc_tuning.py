"""The garbage collector of a long-lived web worker, set once the application is loaded.

A worker holds about half a million objects that live as long as it does: modules,
settings, URL patterns, compiled statements, serializer templates. CPython's oldest
generation is collected whenever enough objects have survived into it, and each such
collection walks every one of those objects again: 60-95 ms a time here, during which
the request in hand waits (docs/BENCHMARKS.md, issue 13, eighth pass). `gc.freeze()`
moves everything alive at that moment into a permanent generation that collections skip,
so they walk only what requests made since. Nothing is leaked by it: frozen objects are
freed by reference counting as before, only cycles among them are left alone, and the
startup objects form no garbage cycles that matter.

Called from gunicorn's `post_worker_init` hook (config/gunicorn.py), after the worker has
imported the application and before its first request.
"""

from __future__ import annotations

import gc


def gc_freeze_after_load() -> int:
    """Collect once, then freeze what is left alive; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
