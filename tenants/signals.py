"""Signals the tenants app sends. Apps above it (wallets) set up their part of a new
tenant by listening, so that tenants never imports them (layers point down)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by tenants.services.tenant_create inside the new tenant's schema, once its schema
# and domain exist; kwargs: tenant.
tenant_created = Signal()
