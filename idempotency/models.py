"""Idempotency records (tenant schema): one row per (principal, key), written by the engine
(`engine`; the claim's INSERT is hand-written, in `hotpath`)."""

from __future__ import annotations

from django.db import models


class RecordState(models.TextChoices):
    IN_FLIGHT = "in_flight", "In flight"
    COMPLETED = "completed", "Completed"
    FAILED_RETRYABLE = "failed_retryable", "Failed (retryable)"


class Effect(models.TextChoices):
    INTERNAL = "internal", "Internal (one transaction)"
    EXTERNAL = "external", "External (claim, call, fenced completion)"


class IdempotencyRecord(models.Model):
    # Scope is (tenant, principal, key): the tenant is the schema this row lives in.
    principal_id = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    # The face ("terminal", ...) or, for tasks and commands, their own scope name.
    scope = models.CharField(max_length=64)
    effect = models.CharField(max_length=10, choices=Effect.choices, default=Effect.INTERNAL)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=20, choices=RecordState.choices)
    # Bumped by every takeover; every transition is a compare-and-set on it.
    fence = models.BigIntegerField(default=1)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The request whose response is stored (Original-Request on replays).
    request_id = models.CharField(max_length=64)
    method = models.CharField(max_length=10, blank=True, default="")
    path = models.CharField(max_length=512, blank=True, default="")
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    # Ids minted at claim time ({"payment": "pay_..."}), stable across re-executions.
    minted = models.JSONField(default=dict, blank=True)
    # Claim time: the replay and tombstone windows run from here.
    created = models.DateTimeField()
    updated = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "idempotency_record"
        ordering = ["-created", "-id"]
        permissions = [("switch_idempotency_mode", "Can switch a face's idempotency mode")]
        constraints = [
            models.UniqueConstraint(fields=["principal_id", "key"], name="idempotency_record_principal_key"),
            models.CheckConstraint(
                condition=(
                    models.Q(state="in_flight", lease_expires_at__isnull=False)
                    | models.Q(state="completed", response_status__isnull=False, response_body__isnull=False)
                    | models.Q(state="failed_retryable")
                ),
                name="idempotency_record_state_fields",
            ),
            models.CheckConstraint(condition=models.Q(fence__gte=1), name="idempotency_record_fence_positive"),
        ]
        indexes = [
            models.Index(fields=["created"], name="idempotency_record_created"),
            models.Index(fields=["lease_expires_at"], name="idempotency_record_inflight", condition=models.Q(state="in_flight")),
        ]

    def __str__(self) -> str:
        return f"{self.principal_id}/{self.key} ({self.state})"
