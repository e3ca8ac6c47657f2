"""Idempotency records in the tenant admin: read-only (SPEC 9). Records change only
through the mechanism; a stuck in-flight key is recovered by lease takeover, not by hand."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from payments.idempotency.models import IdempotencyRecord


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("key", "principal_id", "scope", "state", "response_status", "fence", "created", "completed_at", "request_id")
    list_filter = ("state", "scope", "effect")
    search_fields = ("key", "principal_id", "request_id")
    date_hierarchy = "created"
    readonly_fields = [f.name for f in IdempotencyRecord._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
