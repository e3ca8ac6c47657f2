"""Beat's per-tenant fan-out: one task sent inside each tenant's schema, which
tenant-schemas-celery carries with the message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_tenants.utils import schema_context


def task_send_in_each(task: Any, *, schemas: Sequence[str]) -> int:
    """Send `task` (no arguments) once inside each of `schemas`; returns how many."""
    for schema_name in schemas:
        with schema_context(schema_name):
            task.delay()
    return len(schemas)
