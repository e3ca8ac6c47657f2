"""THE payments service: every face, the admin, the Celery tasks and the commands move
money through these modules, one per movement (charges, refunds, transfers, top-ups,
adjustments, freezes, intents, tokens). Import from the module, not from here.

Each public function is one database transaction (`wallets.transactions.atomic_service`,
conflicts retried whole), posting through `wallets.services.ledger.ledger_post`, the one
place the ledger's rules live. Inside a caller's transaction (the idempotency layer:
claim + effect + outbox + stored response commit together) no savepoint is taken: a
refusal raises, aborts that transaction, and its owner rolls back whatever the service
had written (wallets/transactions.py says why that is safe, and what a caller must not do).
"""
