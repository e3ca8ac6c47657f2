"""THE payments service: every face, the admin, the Celery tasks and the commands move
money through these modules, one per movement (charges, refunds, transfers, top-ups,
adjustments, freezes, intents, tokens). Import from the module, not from here.

Each public function is one database transaction (`wallets.transactions.atomic_service`,
conflicts retried whole), posting through `wallets.services.ledger.ledger_post`, the one
place the ledger's rules live. Every function refuses before it writes, so inside a
caller's transaction (the idempotency layer: claim + effect + outbox + stored response
commit together) a refusal leaves nothing behind; the exception still aborts the
caller's block, whose owner retries conflicts.
"""
