"""Payment tokens: the customer's short-lived, single-use QR for a terminal scan."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.utils import timezone

from payments.models import PAYMENT_TOKEN_PREFIX, PaymentToken, payment_token_hash, payment_token_is_well_formed
from wallets import ids
from wallets.errors import NotFound
from wallets.models import Customer

PAYMENT_TOKEN_TTL = timedelta(seconds=120)
PAYMENT_TOKEN_RANDOM_LENGTH = 32


def payment_token_create(*, customer: Customer) -> tuple[PaymentToken, str]:
    """A token for the customer's QR code, valid PAYMENT_TOKEN_TTL, good for one payment: the
    row and the raw token (shown once; only its SHA-256 is stored)."""
    raw = PAYMENT_TOKEN_PREFIX + ids.random_token(PAYMENT_TOKEN_RANDOM_LENGTH)
    token = PaymentToken.objects.create(customer=customer, token_hash=payment_token_hash(raw), expires_at=timezone.now() + PAYMENT_TOKEN_TTL)
    return token, raw


def payment_token_consume(*, token: object) -> str:
    """Mark a live, unused token used and return its customer id, in the caller's
    transaction; else NotFound. Locks: the token row, in one conditional `UPDATE ..
    RETURNING` (which the ORM's update() cannot): of two payments racing one token, the
    second finds it used."""
    if not payment_token_is_well_formed(token):
        raise NotFound("invalid or expired payment token", param="customer_token")
    assert isinstance(token, str)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{PaymentToken._meta.db_table}" SET used_at = %s '  # noqa: S608 - our own table name, no input
            "WHERE token_hash = %s AND used_at IS NULL AND expires_at > %s RETURNING customer_id",
            [now, payment_token_hash(token), now],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound("invalid, used or expired payment token", param="customer_token")
    return str(row[0])
