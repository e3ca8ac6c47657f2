"""Write services for customer contact data (wallets.contacts holds the representations)."""

from __future__ import annotations

from wallets.contacts import UNSET, Unset, contact_changes, contact_write, customer_contact
from wallets.errors import NotFound
from wallets.locks import customer_lock
from wallets.models import Customer
from wallets.transactions import run_atomic


def customer_contact_update(*, customer_id: str, email: str | Unset | None = UNSET, phone: str | Unset | None = UNSET) -> Customer:
    """Set, clear or leave each contact field: UNSET leaves it, None or "" clears it, a
    value sets it. Writes only the fields that change (nothing when nothing does), to
    every representation the tenant's `customer_contacts` phase writes, in one transaction.

    Locks: the customer row (FOR NO KEY UPDATE). No balance row.
    """

    def update() -> Customer:
        try:
            customer = customer_lock(customer_id=customer_id)
        except Customer.DoesNotExist:
            raise NotFound("no such customer", param="customer") from None
        new_email, new_phone = contact_changes(current=customer_contact(customer=customer), email=email, phone=phone)
        contact_write(customer=customer, email=new_email, phone=new_phone)
        return customer

    return run_atomic(update, operation="customer_contact_update")
