"""Reconciliation runs and their findings (tenant schema), made by
`reconciliation_run_request` and filled in by `reconciliation_run_execute`.

A foreign key has no index of its own (db_index=False) where no query looks rows up by it
and nothing deletes its target, or where a composite index leads with it: each index is a
relation in every tenant (the budget in tests/test_tenant_schemas.py)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class RunTrigger(models.TextChoices):
    BEAT = "beat", "Celery beat (schedule)"
    ADMIN = "admin", "On demand (admin)"
    COMMAND = "command", "manage.py reconcile"


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    CLEAN = "clean", "Clean (no findings)"
    FINDINGS = "findings", "Findings"
    FAILED = "failed", "Failed"


class ReconciliationRun(models.Model):
    id = models.BigAutoField(primary_key=True)
    trigger = models.CharField(max_length=10, choices=RunTrigger.choices)
    status = models.CharField(max_length=10, choices=RunStatus.choices, default=RunStatus.QUEUED)
    requested_by = models.CharField(max_length=150, blank=True, default="")
    created = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    findings_count = models.PositiveIntegerField(default=0)
    # {"checks": {name: {"findings": n, "stored": n, "seconds": s, "stats": {...}}}, "by_kind": {kind: n}}
    report = models.JSONField(default=dict, blank=True)
    # Series the dashboard charts across runs (outbox lag, idempotency states and counters).
    metrics = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["-created", "-id"], name="reconrun_created")]
        # The trial balance and the month-end report show every party's money at once: the
        # finance role's, not every viewer's (wallets.services.roles).
        permissions = [("view_books", "Can see the books: the trial balance and the month-end report")]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status}, {self.findings_count} findings)"


class ReconciliationFinding(models.Model):
    """One discrepancy: its kind and severity, what to act on (`details`) and the rows it
    concerns (`refs`: [{"app_label", "model", "pk"}], links in the admin)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(ReconciliationRun, on_delete=models.CASCADE, related_name="findings", db_index=False)
    check_name = models.CharField(max_length=50)
    kind = models.CharField(max_length=50)
    severity = models.CharField(max_length=10)
    summary = models.CharField(max_length=500)
    details = models.JSONField(default=dict)
    refs = models.JSONField(default=list)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["run", "kind"], name="reconfinding_run_kind")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.summary}"
