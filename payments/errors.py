"""Failures only the payments service raises. The shared families (not found, refusals,
invalid state, conflicts) are in wallets.errors; the API maps every code in one place."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from wallets.errors import InvalidState


class PaymentErrorCode(StrEnum):
    REFUND_WINDOW_CLOSED = "refund_window_closed"


class RefundWindowClosed(InvalidState):
    """Terminals refund only what they took today (SPEC 4): older refunds go through the
    merchant's back office, where someone accountable decides."""

    code: ClassVar[StrEnum] = PaymentErrorCode.REFUND_WINDOW_CLOSED
