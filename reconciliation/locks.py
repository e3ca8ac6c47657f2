"""Row locks of reconciliation: a run's row, alone, in its own short transaction; no business rows."""

from __future__ import annotations

from reconciliation.models import ReconciliationRun


def reconciliation_run_lock(*, run_id: int) -> ReconciliationRun:
    """A run's row, FOR UPDATE, while it is marked running: taken alone."""
    return ReconciliationRun.objects.select_for_update().get(pk=run_id)
