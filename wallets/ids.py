"""Opaque, unguessable, type-prefixed ids (`cus_...`, `pay_...`).

Each model's id default is named here so migrations can reference it.
"""

from __future__ import annotations

import secrets
import string
from functools import partial

_ALPHABET = string.ascii_letters + string.digits
ID_RANDOM_LENGTH = 24  # 62**24 ~ 2**143: unguessable, collision-free in practice
ID_MAX_LENGTH = 32


# Byte -> character table for random_token: 248 = 4 x 62, so bytes below 248 map onto the
# 62 characters uniformly and the 8 bytes above are dropped (rejection sampling, in C).
_BYTE_TO_CHAR = bytes(ord(_ALPHABET[b % 62]) if b < 248 else 0 for b in range(256))
_REJECTED_BYTES = bytes(range(248, 256))


def random_token(length: int) -> str:
    """`length` characters drawn uniformly from [A-Za-z0-9] by the OS CSPRNG."""
    chars = b""
    while len(chars) < length:
        chars += secrets.token_bytes(length + 8).translate(_BYTE_TO_CHAR, _REJECTED_BYTES)
    return chars[:length].decode("ascii")


def new_id(prefix: str) -> str:
    return f"{prefix}_{random_token(ID_RANDOM_LENGTH)}"


new_customer_id = partial(new_id, "cus")
new_merchant_id = partial(new_id, "mer")
new_store_id = partial(new_id, "sto")
new_terminal_id = partial(new_id, "ter")
new_staff_id = partial(new_id, "stf")
new_api_key_id = partial(new_id, "key")
new_account_id = partial(new_id, "acc")
new_payment_id = partial(new_id, "pay")
new_refund_id = partial(new_id, "ref")
new_transfer_id = partial(new_id, "trf")
new_topup_id = partial(new_id, "top")
new_payment_intent_id = partial(new_id, "pi")
new_adjustment_id = partial(new_id, "adj")
new_event_id = partial(new_id, "evt")
new_ledger_transaction_id = partial(new_id, "txn")
new_hold_id = partial(new_id, "hld")
new_webhook_endpoint_id = partial(new_id, "we")
