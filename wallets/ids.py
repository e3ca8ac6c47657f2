"""Opaque, unguessable, type-prefixed ids (`cus_...`, `pay_...`).

Each model's id default is a named function here so migrations can reference it.
"""

from __future__ import annotations

import secrets
import string

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


def new_customer_id() -> str:
    return new_id("cus")


def new_merchant_id() -> str:
    return new_id("mer")


def new_store_id() -> str:
    return new_id("sto")


def new_terminal_id() -> str:
    return new_id("ter")


def new_staff_id() -> str:
    return new_id("stf")


def new_api_key_id() -> str:
    return new_id("key")


def new_account_id() -> str:
    return new_id("acc")


def new_payment_id() -> str:
    return new_id("pay")


def new_refund_id() -> str:
    return new_id("ref")


def new_transfer_id() -> str:
    return new_id("trf")


def new_topup_id() -> str:
    return new_id("top")


def new_payment_intent_id() -> str:
    return new_id("pi")


def new_adjustment_id() -> str:
    return new_id("adj")


def new_event_id() -> str:
    return new_id("evt")


def new_ledger_transaction_id() -> str:
    return new_id("txn")


def new_hold_id() -> str:
    return new_id("hld")


def new_webhook_endpoint_id() -> str:
    return new_id("we")


def new_webhook_delivery_id() -> str:
    return new_id("wd")


def new_reconciliation_report_id() -> str:
    return new_id("rec")
