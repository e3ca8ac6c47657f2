"""Django admin (tenant site): the staged migrations' state, read-only. Phases change only
through `manage.py staged_migration` (wallets.staged.runner); this page shows where each
migration stands in the tenant: phase, backfill progress, counts, timings, last verify."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from wallets.models import StagedMigrationState


@admin.register(StagedMigrationState)
class StagedMigrationStateAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "phase", "phase_changed_at", "progress", "rows_written", "backfill_seconds", "verify_ok", "verified_at")
    readonly_fields = (
        "name", "phase", "phase_changed_at", "cursor", "rows_total", "rows_done", "rows_written", "backfill_started_at",
        "backfill_finished_at", "backfill_seconds", "verified_at", "verify_ok", "verify_report", "history", "discard_pending", "updated",
    )

    @admin.display(description="backfill")
    def progress(self, obj: StagedMigrationState) -> str:
        return f"{obj.rows_done}/{obj.rows_total}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
