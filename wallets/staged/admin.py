"""The staged migrations' state in the tenant admin, read-only: phases change only through
`manage.py staged_migration`."""

from __future__ import annotations

from django.contrib import admin

from wallets.adminkit import ReadOnlyMixin
from wallets.models import StagedMigrationState


@admin.register(StagedMigrationState)
class StagedMigrationStateAdmin(ReadOnlyMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "phase", "phase_changed_at", "progress", "rows_written", "backfill_seconds", "verify_ok", "verified_at")
    readonly_fields = [f.name for f in StagedMigrationState._meta.fields]

    @admin.display(description="backfill")
    def progress(self, obj: StagedMigrationState) -> str:
        return f"{obj.rows_done}/{obj.rows_total}"
