"""Signals the tenants app sends. Apps above it (wallets) set up their part of a new
tenant by listening, so that tenants never imports them (layers point down)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by tenants.services.tenant_setup inside a new tenant's schema, once it exists; kwargs: tenant.
tenant_created = Signal()
