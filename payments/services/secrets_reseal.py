"""The payments app's sealed stores, re-sealed by `manage.py secrets_reseal` (wallets.sealing)."""

from __future__ import annotations

from django.db import connection

from payments.gateways.credentials import SCHEME as CREDENTIALS
from payments.gateways.credentials import credential_aad
from payments.locks import gateway_account_rows_lock
from payments.models import GatewayAccount
from wallets.sealing import UNOPENED, ResealBatch, secret_reseal
from wallets.services.contacts import customer_contacts_reencrypt
from wallets.transactions import run_atomic


def gateway_accounts_reseal(after: str = "", limit: int = 500) -> ResealBatch:
    """Every gateway account's sealed credentials (one batch: one row per gateway).
    Locks: the gateway account rows, as gateway_account_set does."""

    def batch() -> ResealBatch:
        schema = str(getattr(connection, "schema_name", "public"))
        resealed, unopened = 0, []
        for account in gateway_account_rows_lock():
            fields: dict[str, bytes] = {}
            try:
                for name, field in (("secret_key_sealed", "secret_key"), ("webhook_secrets_sealed", "webhook_secrets")):
                    aad = credential_aad(schema, account.gateway, field)
                    new = secret_reseal(scheme=CREDENTIALS, sealed=bytes(getattr(account, name)), associated_data=aad)
                    if new is not None:
                        fields[name] = new
            except UNOPENED:
                unopened.append(str(account.pk))
                continue
            if fields:
                GatewayAccount.objects.filter(pk=account.pk).update(**fields)
                resealed += 1
        return ResealBatch(cursor=None, resealed=resealed, unopened=tuple(unopened))

    return run_atomic(batch, operation="gateway_accounts_reseal")


def customer_contacts_reseal(after: str = "", limit: int = 500) -> ResealBatch:
    """Customer contacts re-encrypted under the newest TALLY_CONTACT_ENCRYPTION_KEYS key
    (wallets.contacts). Locks: customer_contacts_reencrypt's."""
    cursor, rewritten, unopened = customer_contacts_reencrypt(after=after, limit=limit)
    return ResealBatch(cursor=cursor, resealed=rewritten, unopened=unopened)
