"""`migrate` is `migrate_schemas` here, as in django-tenants, but ours (skipping up-to-date tenants)."""

from tenants.management.commands.migrate_schemas import Command

__all__ = ["Command"]
