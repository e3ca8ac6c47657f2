"""Transfers: customer -> customer (P2P)."""

from __future__ import annotations

from payments.models import Transfer
from payments.services.outbox import epoch_seconds, outbox_event_create
from wallets import ids
from wallets.errors import InvalidRequest
from wallets.models import Customer, LedgerTransactionKind
from wallets.money import amount_to_minor
from wallets.selectors import asset_get, customer_accounts_get
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service


@atomic_service(operation="transfer_create")
def transfer_create(*, from_customer: Customer, to_customer: Customer, asset_code: str, amount: object) -> Transfer:
    """Move `amount` between two customers' wallets. Locks: both customers' balance rows in
    one statement in the global order (ledger_post): A->B and B->A queue, not deadlock."""
    minor = amount_to_minor(amount)
    if from_customer.pk == to_customer.pk:
        raise InvalidRequest("cannot transfer to the same wallet", param="to_customer")
    asset = asset_get(asset_code=asset_code)
    accounts = customer_accounts_get(customer_ids=[from_customer.pk, to_customer.pk])
    source, target = accounts[from_customer.pk], accounts[to_customer.pk]
    transfer_id = ids.new_transfer_id()
    txn = ledger_post(
        kind=LedgerTransactionKind.TRANSFER, reference=transfer_id, legs=[Leg(source, asset.code, -minor), Leg(target, asset.code, minor)]
    )
    transfer = Transfer.objects.create(
        id=transfer_id, from_customer=from_customer, to_customer=to_customer, asset=asset, amount=minor, ledger_transaction=txn
    )
    outbox_event_create(
        topic="transfer.succeeded",
        payload={
            "id": transfer.id, "object": "transfer", "from_customer": from_customer.pk, "to_customer": to_customer.pk,
            "asset": asset.code, "amount": minor, "created": epoch_seconds(transfer.created),
        },
    )
    return transfer
