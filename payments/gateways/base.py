"""The gateway interface every PSP adapter implements, and its typed outcomes. A charge is
created with OUR idempotency key (the top-up id), a payout with the payout id: asking again
returns the first one. An answer we did not get (timeout, 5xx), or one that does not speak
for the object under our key (our credentials refused, the PSP's idempotency layer
objecting), is `GatewayUnavailable`: only asking again with the same key resolves it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal, Protocol

from celery.exceptions import SoftTimeLimitExceeded


def time_limit_reraise(exc: BaseException) -> None:
    """Re-raise Celery's SoftTimeLimitExceeded found in `exc`'s cause or context chain: an
    HTTP client that wraps its transport's every exception (stripe-python) would otherwise
    turn the task's time being up into "the PSP did not answer"."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, SoftTimeLimitExceeded):
            raise current
        seen.add(id(current))
        current = current.__cause__ or current.__context__


class GatewayError(Exception):
    """Base of the adapters' failures."""


class GatewayUnavailable(GatewayError):
    """No answer (timeout, connection, 5xx): the charge may or may not exist."""


class GatewayRejected(GatewayError):
    """The PSP refused the request's parameters (not a decline): nothing was charged, and
    would not be on asking again. `param` and `code` are the PSP's, when given."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class GatewayReturnRefused(GatewayError):
    """The PSP refused a payout after part of it had gone (at Stripe: the payout on the
    connected account refused, after the transfer to it was made), then refused to take that
    part back: money sits at the PSP on its way to the merchant, neither sent nor returned.
    Not a refusal of the request (nothing moves back to the merchant on it): a person looks.
    `failure_code` is the PSP's code for the payout's refusal."""

    def __init__(self, message: str, *, failure_code: str = "") -> None:
        super().__init__(message)
        self.failure_code = failure_code


class GatewayNotConfigured(GatewayError):
    """The tenant has no (active) account for this gateway."""


@dataclass(frozen=True)
class ChargeRequest:
    amount: int  # minor units
    currency: str
    payment_method: str
    idempotency_key: str
    reference: str  # our object (the top-up id), sent as metadata


@dataclass(frozen=True)
class ChargeResult:
    status: Literal["succeeded", "failed"]
    psp_reference: str
    amount: int
    currency: str
    failure_code: str = ""
    created: datetime | None = None


@dataclass(frozen=True)
class RefundResult:
    psp_reference: str
    amount: int


@dataclass(frozen=True)
class BankAccountResult:
    """A merchant's bank account as the PSP holds it: what payouts are sent to, and the last
    four digits (all Tally keeps of it)."""

    psp_reference: str
    last4: str


@dataclass(frozen=True)
class PayoutRequest:
    amount: int  # minor units
    currency: str
    destination: str  # the bank account's PSP reference
    idempotency_key: str  # our payout id
    reference: str  # our payout id, sent as metadata (tally_payout)


@dataclass(frozen=True)
class PayoutResult:
    """The PSP's payout: `in_transit` (it has it), `paid` (arrived) or `failed` (declined at
    once, or returned later: the money is back at the PSP)."""

    status: Literal["in_transit", "paid", "failed"]
    psp_reference: str
    amount: int
    currency: str
    failure_code: str = ""
    arrival: datetime | None = None  # when the PSP promises it arrives
    created: datetime | None = None


@dataclass(frozen=True)
class SettlementLine:
    psp_reference: str
    kind: Literal["charge", "refund", "payout"]
    amount: int  # signed: refunds and payouts negative
    currency: str
    reference: str  # our object id from the metadata ("" if none)


@dataclass(frozen=True)
class SettlementReport:
    day: date
    lines: list[SettlementLine] = field(default_factory=list)


@dataclass(frozen=True)
class PspEvent:
    """An inbound webhook, parsed: its id (deduplicated), type and what it is about."""

    id: str
    type: str
    kind: Literal["charge_succeeded", "charge_failed", "payout_paid", "payout_failed", "other"]
    reference: str  # our top-up or payout id from the metadata ("" if none)
    psp_reference: str
    failure_code: str
    created: datetime | None
    amount: int = 0
    currency: str = ""


class Gateway(Protocol):
    name: str

    def charge(self, request: ChargeRequest) -> ChargeResult: ...

    def refund(self, *, psp_reference: str, amount: int, idempotency_key: str) -> RefundResult: ...

    def charges_of(self, *, reference: str) -> list[ChargeResult]:
        """Every charge the PSP holds for our object `reference` (a read: safe however old
        the charge's idempotency key)."""
        ...

    def settlement_report(self, *, day: date) -> SettlementReport: ...

    def event_parse(self, body: bytes) -> PspEvent: ...

    def bank_account_attach(self, *, token: str, reference: str, current: str = "") -> BankAccountResult:
        """Hold the bank account of PSP `token` for our merchant `reference` (replacing
        `current`, its earlier PSP reference, if any)."""
        ...

    def payout_create(self, request: PayoutRequest) -> PayoutResult:
        """Send money to a bank account under our key; a decline is a `failed` result (what
        it sent on first taken back). Raises GatewayReturnRefused when the PSP refused the
        payout and then refused to take back what it had sent on for it."""
        ...

    def payouts_of(self, *, reference: str, destination: str, psp_reference: str = "", since: datetime | None = None) -> list[PayoutResult]:
        """Every payout the PSP holds for our payout `reference` (a read: safe however old its
        key): the one of `psp_reference` when we know it, else all of `destination`'s made
        since `since` (our payout's creation: the PSP's cannot be older), every page of them."""
        ...

    def payout_return(self, *, reference: str, psp_reference: str, destination: str, idempotency_key: str) -> None:
        """Take back what our payout `reference` sent on, now that the PSP failed or canceled
        its payout `psp_reference` (or two staff members confirmed it failed): at Stripe,
        reverse each transfer to the merchant's connected account, under a key made of
        `idempotency_key` and the transfer's id. Done already, or nothing to take back (no
        money of it ever left; `psp_reference` may be empty when the PSP never named a
        payout), is success. Raises GatewayRejected when the PSP refuses (the money is not
        there to take: a person looks), GatewayUnavailable when the outcome is unknown
        (asked again later under the same key)."""
        ...

    def destination_balance(self, *, destination: str) -> dict[str, int]:
        """What the PSP holds, per currency (upper case, minor units, available and pending),
        where it keeps a merchant's money on its way to the bank account `destination` (at
        Stripe: the connected account's balance). Zero once no payout of it is unfinished."""
        ...
