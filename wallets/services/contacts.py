"""Write services for customer contact data (wallets.contacts holds the representations)."""

from __future__ import annotations

from cryptography.fernet import InvalidToken

from wallets.contacts import UNSET, Unset, contact_changes, contact_rotate, contact_write, customer_contact
from wallets.errors import NotFound
from wallets.locks import customer_lock, customer_rows_lock
from wallets.models import Customer
from wallets.transactions import run_atomic


def customer_contact_update(*, customer_id: str, email: str | Unset | None = UNSET, phone: str | Unset | None = UNSET) -> Customer:
    """Set, clear or leave each contact field (UNSET leaves it, None or "" clears it), writing
    only what changes. Locks: the customer row (FOR NO KEY UPDATE). No balance row."""

    def update() -> Customer:
        try:
            customer = customer_lock(customer_id=customer_id)
        except Customer.DoesNotExist:
            raise NotFound("no such customer", param="customer") from None
        new_email, new_phone = contact_changes(current=customer_contact(customer=customer), email=email, phone=phone)
        contact_write(customer=customer, email=new_email, phone=new_phone)
        return customer

    return run_atomic(update, operation="customer_contact_update")


def customer_contacts_reencrypt(*, after: str = "", limit: int = 500) -> tuple[str | None, int, tuple[str, ...]]:
    """Re-encrypt the next `limit` customers' older tokens under the newest key: (next cursor
    or None, rows rewritten, ids whose token no key opens, left as they are). Locks: the
    batch's customer rows in id order (customer_rows_lock)."""

    def batch() -> tuple[str | None, int, tuple[str, ...]]:
        ids = customer_rows_lock(after=after, limit=limit)
        rewritten, unopened = 0, []
        for customer in Customer.objects.filter(pk__in=ids).only("id", "email_ciphertext", "phone_ciphertext").order_by("pk"):
            try:
                fields = {name: contact_rotate(token) for name in ("email_ciphertext", "phone_ciphertext") if (token := getattr(customer, name))}
            except InvalidToken:  # one bad row is reported, the rest still re-encrypted
                unopened.append(str(customer.pk))
                continue
            changed = {name: token for name, token in fields.items() if token is not None}
            if changed:
                Customer.objects.filter(pk=customer.pk).update(**changed)
                rewritten += 1
        return (ids[-1] if len(ids) == limit else None), rewritten, tuple(unopened)

    return run_atomic(batch, operation="customer_contacts_reencrypt")
