"""Staged data migrations: evolve a tenant's data under live traffic (expand, backfill,
verify, switch reads, contract), one phase at a time, each safe to stop at any point.
The migrations live with the data they own and register in their app's ready(); the
command is `manage.py staged_migration`.
"""
