"""Staged data migrations: evolve a tenant's data under live traffic (expand, backfill,
verify, switch reads, contract), one phase at a time, each safe to stop at any point.

    phases  the phase order and the switches the service layer reads (short-TTL cache)
    spec    what a migration implements (StagedMigration) and the registry
    runner  the phase transitions, the batched/throttled/resumable backfill, verify

The migrations themselves live with the data they own (wallets.contacts,
wallets.daily_totals, webhooks.secrets) and register in their app's ready(). The command is
`manage.py staged_migration`.
"""
