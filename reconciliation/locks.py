"""Row locks of reconciliation. Lock order (wallets/locks.py): a run's row is taken alone,
in its own short transaction, before the run reads anything; a run takes no lock on
business rows."""

from __future__ import annotations

from reconciliation.models import ReconciliationRun


def reconciliation_run_lock(*, run_id: int) -> ReconciliationRun:
    """A run's row, FOR UPDATE, while it is marked running: taken alone."""
    return ReconciliationRun.objects.select_for_update().get(pk=run_id)
