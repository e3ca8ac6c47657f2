"""Statements: one party's account in one asset over a period [start, end), read from the
ledger. Reads only; the faces (JSON, CSV, PDF) and the back office render what this returns.

Opening is the balance before `start` and closing the balance before `end`
(wallets.books), so one month's closing is the next month's opening. The lines are the
account's entries in the period in (created, id) order, each with its running balance,
read in chunks from one server-side cursor: memory stays flat whatever the period holds,
and what a line needs besides its entry (its payment's fee, the other party) is fetched
once per chunk, never per line.

Who sees what of the other party follows what each face already shows:
- a customer sees the merchant (id and name) of a payment or refund, the other customer's
  id of a transfer (never their name), and no fee (the operator's fee is the merchant's
  business, as on GET /v1/customer/payments);
- a merchant sees the customer's id of a payment or refund (as on its payments), and the
  operator's fee of each line, signed as it moved the merchant's balance: a payment's fee
  taken is negative (the line's amount is the payment's amount plus it), a refund's fee
  given back positive (the merchant paid the refund's amount less it); so a fully refunded
  payment's fees sum to zero, as its amounts do;
- staff see both parties' ids and names and every fee.
Top-ups, adjustments and payouts have no counterparty (the operator and the PSP are not
parties).

Finality: a posting stamps `created` in Python before it commits, so an entry stamped just
before `end` may commit just after it. A period that ended less than
TALLY_STATEMENT_FINAL_AFTER_SECONDS ago (or has not ended) is answered with
`final=False`; after that its content never changes: a correction is a new ledger
transaction, stamped when it is made, in the period it was made in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from payments.models import Payment, Refund, Transfer
from tenants.selectors import tenant_current, tenant_zone
from wallets.books import account_balance_before
from wallets.errors import NotFound
from wallets.models import Account, Asset, Customer, LedgerEntry, LedgerTransactionKind, Merchant

CHUNK = 2000  # entries per server-side fetch; the chunk's payments and parties in one query each
MAX_PERIOD = timedelta(days=366)  # a statement's longest period: a year, leap or not (a month is always within it)
PDF_MAX_LINES = 20_000  # a PDF is built in memory (about 480 pages at this count); longer periods are for the streamed CSV
PAYMENT_KINDS = {LedgerTransactionKind.PAYMENT.value, LedgerTransactionKind.CAPTURE.value}


class Viewer(StrEnum):
    """Whose eyes a statement is for: decides the counterparty and fee columns."""

    CUSTOMER = "customer"
    MERCHANT = "merchant"
    STAFF = "staff"


@dataclass(frozen=True)
class StatementHead:
    """What every page and file of a statement carries besides its lines."""

    tenant_name: str
    party_type: str  # customer | merchant
    party_id: str
    party_name: str
    account_id: str
    asset: Asset
    start: datetime  # UTC
    end: datetime  # UTC, exclusive
    zone: ZoneInfo
    opening: int
    closing: int  # the balance before `end` when the head was read
    final: bool
    as_of: datetime  # when the head was read


@dataclass(frozen=True)
class StatementLine:
    entry_id: int
    created: datetime  # UTC, exact (the cursor's position)
    time: datetime  # `created` in the tenant's time zone
    kind: str
    object_id: str
    counterparty: str | None
    counterparty_name: str | None
    amount: int
    fee: int | None
    balance: int  # after this line


def statement_final_after() -> timedelta:
    """How long after a period's end its statement is final: the longest a posting
    transaction may stay open after stamping its entries (TALLY_STATEMENT_FINAL_AFTER_SECONDS)."""
    return timedelta(seconds=float(settings.TALLY_STATEMENT_FINAL_AFTER_SECONDS))


def statement_account_get(*, customer_id: str | None = None, merchant_id: str | None = None) -> tuple[Account, str, str]:
    """(account, party type, party name) of a customer or a merchant; NotFound if it has none."""
    if customer_id is not None:
        customer = Customer.objects.filter(pk=customer_id).select_related("account").first()
        if customer is None:
            raise NotFound("no such customer", param="customer")
        return customer.account, "customer", customer.name
    merchant = Merchant.objects.filter(pk=merchant_id).select_related("account").first()
    if merchant is None:
        raise NotFound("no such merchant", param="merchant")
    return merchant.account, "merchant", merchant.name


def statement_head(
    *, account: Account, party_type: str, party_name: str, asset: Asset, start: datetime, end: datetime, now: datetime | None = None,
) -> StatementHead:
    """The statement's opening, closing and finality over [start, end) (UTC instants)."""
    now = now or timezone.now()
    party_id = account.customer_id if party_type == "customer" else account.merchant_id
    assert party_id is not None
    return StatementHead(
        tenant_name=tenant_current().name, party_type=party_type, party_id=party_id, party_name=party_name, account_id=account.pk,
        asset=asset, start=start, end=end, zone=tenant_zone(),
        opening=account_balance_before(account_id=account.pk, asset_code=asset.code, instant=start),
        closing=account_balance_before(account_id=account.pk, asset_code=asset.code, instant=end),
        final=end <= now - statement_final_after(), as_of=now,  # `end + ...` would overflow for an end near 9999
    )


def statement_line_count_exceeds(*, head: StatementHead, limit: int) -> bool:
    """Whether the period holds more than `limit` lines (counts at most limit + 1 entries)."""
    entries = LedgerEntry.objects.filter(account_id=head.account_id, asset_id=head.asset.code, created__gte=head.start, created__lt=head.end)
    return entries.order_by()[: limit + 1].count() > limit


def _balance_through(*, head: StatementHead, created: datetime, entry_id: int) -> int:
    """The running balance after the entry at position (created, entry_id): the balance
    before `created` plus the entries stamped at that very microsecond up to that id."""
    same = (LedgerEntry.objects.filter(account_id=head.account_id, asset_id=head.asset.code, created=created, id__lte=entry_id)
            .aggregate(total=Sum("amount")))
    return account_balance_before(account_id=head.account_id, asset_code=head.asset.code, instant=created) + int(same["total"] or 0)


def statement_lines(
    *, head: StatementHead, viewer: Viewer, after: tuple[datetime, int] | None = None, limit: int | None = None,
) -> Iterator[StatementLine]:
    """The period's lines in (created, id) order, from the start or after the position
    `after` (a page's cursor), at most `limit` of them. Streams: one server-side cursor,
    two or three lookups per CHUNK lines."""
    entries = LedgerEntry.objects.filter(account_id=head.account_id, asset_id=head.asset.code, created__gte=head.start, created__lt=head.end)
    balance = head.opening
    if after is not None and after[0] >= head.start:
        created, entry_id = after
        entries = entries.filter(created__gte=created).exclude(created=created, id__lte=entry_id)
        balance = _balance_through(head=head, created=created, entry_id=entry_id)
    rows = (entries.order_by("created", "id")
            .values_list("id", "created", "amount", "transaction__kind", "transaction__reference"))
    if limit is not None:
        rows = rows[:limit]
    stream = rows.iterator(chunk_size=CHUNK)
    while chunk := tuple(itertools.islice(stream, CHUNK)):
        details = _details(chunk, viewer=viewer, party_type=head.party_type, party_id=head.party_id, asset_code=head.asset.code)
        for entry_id, created, amount, kind, reference in chunk:
            balance += amount
            counterparty, name, fee = details.get(reference, (None, None, None))
            yield StatementLine(
                entry_id=entry_id, created=created, time=created.astimezone(head.zone), kind=kind, object_id=reference,
                counterparty=counterparty, counterparty_name=name, amount=amount, fee=fee, balance=balance,
            )


_Detail = tuple[str | None, str | None, int | None]  # counterparty id, its name (where shown), fee (where shown)


def _details(chunk: tuple[tuple[int, datetime, int, str, str], ...], *, viewer: Viewer, party_type: str, party_id: str,
             asset_code: str) -> dict[str, _Detail]:
    """What the chunk's lines show of their business objects, by reference: one query per
    kind of object the chunk holds, and one for the parties' names."""
    refs: dict[str, set[str]] = {"payment": set(), "refund": set(), "transfer": set()}
    for _, _, _, kind, reference in chunk:
        if kind in PAYMENT_KINDS:
            refs["payment"].add(reference)
        elif kind == LedgerTransactionKind.REFUND:
            refs["refund"].add(reference)
        elif kind == LedgerTransactionKind.TRANSFER:
            refs["transfer"].add(reference)
    # reference -> (customer, merchant, fee as it moved the merchant's balance, the object's asset)
    facts: dict[str, tuple[str, str, int, str]] = {}
    if refs["payment"]:
        for pk, customer, merchant, fee, asset in Payment.objects.filter(pk__in=refs["payment"]).values_list(
                "pk", "customer_id", "merchant_id", "fee", "asset_id"):
            facts[pk] = (customer, merchant, -fee, asset)  # taken from the merchant
    if refs["refund"]:
        for pk, customer, merchant, fee, asset in Refund.objects.filter(pk__in=refs["refund"]).values_list(
                "pk", "payment__customer_id", "payment__merchant_id", "fee", "payment__asset_id"):
            facts[pk] = (customer, merchant, fee, asset)  # given back to the merchant
    transfers: dict[str, tuple[str, str]] = {}
    if refs["transfer"]:
        transfers = {pk: (src, dst) for pk, src, dst in Transfer.objects.filter(pk__in=refs["transfer"]).values_list(
            "pk", "from_customer_id", "to_customer_id")}

    details: dict[str, _Detail] = {}
    for ref, (customer, merchant, fee, asset) in facts.items():
        other = merchant if party_type == "customer" else customer
        shown_fee = fee if party_type == "merchant" and viewer != Viewer.CUSTOMER and asset == asset_code else None
        details[ref] = (other, None, shown_fee)
    for ref, (src, dst) in transfers.items():
        details[ref] = (dst if src == party_id else src, None, None)
    return _with_names(details, viewer=viewer)


def _with_names(details: dict[str, _Detail], *, viewer: Viewer) -> dict[str, _Detail]:
    """Names where the viewer may see them: a merchant's to anyone (it is on the receipt),
    a customer's to staff only."""
    ids = {other for other, _, _ in details.values() if other}
    merchants = [i for i in ids if i.startswith("mer_")]
    customers = [i for i in ids if i.startswith("cus_")] if viewer == Viewer.STAFF else []
    names: dict[str, str] = {}
    if merchants:
        names.update(Merchant.objects.filter(pk__in=merchants).values_list("pk", "name"))
    if customers:
        names.update(Customer.objects.filter(pk__in=customers).values_list("pk", "name"))
    return {ref: (other, names.get(other) if other else None, fee) for ref, (other, _, fee) in details.items()}
