"""The payments service: one module per movement; every face, the admin, the tasks and the
commands move money through them. Each public function is one transaction
(`wallets.transactions.atomic_service`) posting through `wallets.services.ledger.ledger_post`.
"""
