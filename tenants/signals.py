"""Signals the tenants app sends. Apps above it (wallets) set up their part of a new
tenant by listening, so that tenants never imports them (layers point down)."""

from __future__ import annotations

from dataclasses import dataclass

from django.dispatch import Signal

# Sent by tenants.services.tenant_setup inside a new tenant's schema, once it exists; kwargs: tenant.
tenant_created = Signal()

# Sent by tenants.restore.tenant_restore with the restored copy of a tenant's schema landed
# under its staging name, the connection set to it (kwargs: tenant, a stand-in whose
# schema_name is the staging schema). A receiver checks what it owns there and returns a
# StagedCheck; any `blocking` line refuses the restore before the swap.
tenant_restore_staged = Signal()

# Sent by tenants.restore.tenant_restore once the restored schema is the tenant's (after the
# swap committed); kwargs: schema_name. Receivers drop what their processes remember of it.
tenant_restored = Signal()


@dataclass(frozen=True)
class StagedCheck:
    """A receiver's answer to `tenant_restore_staged`: what refuses the restore, and what the
    operator is told but which the restore may carry (a restore point's own state)."""

    blocking: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
