"""Switching a face's idempotency mode (SPEC 6 rollout): audited, from any staff surface."""

from __future__ import annotations

from django.db import transaction
from django_tenants.utils import schema_context

from idempotency.locks import tenant_lock
from tenants.models import IdempotencyMode, Tenant
from wallets.errors import InvalidRequest
from wallets.services.audit import audit_record

FACES = ("customer", "terminal", "merchant", "admin")


def idempotency_mode_set(*, tenant: Tenant, face: str, mode: str, reason: str = "") -> Tenant:
    """Set `face`'s idempotency mode on `tenant`, audited in the tenant's own log in the same
    transaction; the current mode changes nothing. Locks: the tenant row (public schema)."""
    if face not in FACES:
        raise InvalidRequest(f"face must be one of {', '.join(FACES)}", param="face")
    if mode not in IdempotencyMode.values:
        raise InvalidRequest(f"mode must be one of {', '.join(IdempotencyMode.values)}", param="mode")
    with transaction.atomic():
        locked = tenant_lock(tenant_id=tenant.pk)
        before = locked.idempotency_mode_for(face)
        if before == mode:
            return locked
        setattr(locked, f"idempotency_{face}", mode)
        locked.save(update_fields=[f"idempotency_{face}"])
        with schema_context(locked.schema_name):
            audit_record(
                action="idempotency.mode_set", target_type="tenant_face", target_id=f"{locked.schema_name}:{face}",
                before={"face": face, "mode": before}, after={"face": face, "mode": mode}, reason=reason,
            )
    return locked
