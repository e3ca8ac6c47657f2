"""Mandates: a customer's standing consent that a merchant may charge them by customer id."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from payments.errors import ChargeByCustomerIdNotPermitted
from payments.locks import mandate_lock
from payments.models import Mandate
from payments.selectors import mandate_active_exists
from payments.services.outbox import epoch_seconds, outbox_event_create
from tenants.selectors import tenant_current
from wallets.models import Customer, Merchant
from wallets.transactions import atomic_service


def charge_by_customer_id_check(*, customer_id: str, merchant_id: str) -> None:
    """Refuse a charge by bare customer id unless the tenant allows it or the customer holds
    an active mandate for this merchant; checked before the customer is looked up, so a
    refusal does not tell whether the id exists."""
    if tenant_current().charge_by_customer_id:
        return
    if not mandate_active_exists(customer_id=customer_id, merchant_id=merchant_id):
        raise ChargeByCustomerIdNotPermitted()


@atomic_service(operation="mandate_grant")
def mandate_grant(*, customer: Customer, merchant: Merchant) -> Mandate:
    """Let `merchant` charge `customer` by customer id; granting again (or racing, a unique
    index) returns the active mandate. Locks: none."""
    active = Mandate.objects.filter(customer=customer, merchant=merchant, revoked_at__isnull=True).first()
    if active is not None:
        return active
    try:
        with transaction.atomic():  # a savepoint: a concurrent grant may win the unique index
            mandate = Mandate.objects.create(customer=customer, merchant=merchant)
    except IntegrityError:
        return Mandate.objects.get(customer=customer, merchant=merchant, revoked_at__isnull=True)
    outbox_event_create(
        topic="mandate.granted",
        payload={"id": mandate.id, "object": "mandate", "customer": customer.pk, "merchant": merchant.pk, "created": epoch_seconds(mandate.created)},
    )
    return mandate


@atomic_service(operation="mandate_revoke")
def mandate_revoke(*, mandate: Mandate) -> Mandate:
    """Revoke a mandate (again: a no-op). Locks: the mandate row."""
    locked = mandate_lock(mandate_id=mandate.pk)
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        outbox_event_create(
            topic="mandate.revoked",
            payload={"id": locked.id, "object": "mandate", "customer": locked.customer_id, "merchant": locked.merchant_id},
        )
    return locked
