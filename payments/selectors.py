"""Reads of the payments app: balances (the SUM over an account's shard rows), ledger
history, and money objects scoped to a principal (another principal's object is NotFound)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from time import monotonic
from typing import TypeVar

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Min, Model, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from payments.models import (
    Adjustment,
    FeeSchedule,
    GatewayAccount,
    Mandate,
    MerchantBankAccount,
    Payment,
    PaymentIntent,
    PaymentToken,
    Payout,
    PayoutStatus,
    PendingAdjustment,
    Refund,
    TopUp,
    TopUpStatus,
    Transfer,
    payment_token_hash,
    payment_token_is_well_formed,
)
from wallets.errors import NotFound
from wallets.models import Account, Customer, LedgerEntry, Merchant, StaffMember
from wallets.money import fee_for
from wallets.selectors import BalanceLine, account_balance_lines, merchant_funds

M = TypeVar("M", bound=Model)


def _one(rows: QuerySet[M], *, missing: str, param: str | None) -> M:
    row = rows.first()
    if row is None:
        raise NotFound(missing, param=param)
    return row


def wallet_balances(*, customer: Customer) -> list[BalanceLine]:
    return account_balance_lines(account=Account.objects.get(customer_id=customer.pk))


class MerchantBalanceLine(BalanceLine):
    pending: int


def merchant_balances(*, merchant: Merchant) -> list[MerchantBalanceLine]:
    """Every asset, its available and pending split (wallets.selectors.merchant_funds)."""
    return [
        {"asset": f.asset_code, "balance": f.balance, "available": f.available, "pending": f.pending, "held": f.held}
        for f in merchant_funds(merchant=merchant)
    ]


def carbon_impact_grams(*, customer: Customer | None = None, merchant: Merchant | None = None) -> int:
    """Net grams of CO2 recorded for a customer's or a merchant's payments (after refunds),
    summed from the payments themselves (each keeps what it earned and what refunds took back)."""
    if (customer is None) == (merchant is None):
        raise TypeError("pass exactly one of customer and merchant")
    scope = {"customer_id": customer.pk} if customer is not None else {"merchant_id": getattr(merchant, "pk", None)}
    payments = Payment.objects.filter(**scope)
    total = payments.aggregate(total=Sum(F("carbon_grams") - F("carbon_grams_reversed")))["total"]
    return int(total or 0)


def ledger_entries_for_customer(
    *,
    customer: Customer,
    asset_code: str | None = None,
    created_gte: datetime | None = None,
    created_lt: datetime | None = None,
    newest_first: bool = True,
) -> QuerySet[LedgerEntry]:
    """The customer's ledger entries in (created, id) order, newest first by default (a
    stable total order for cursor pagination)."""
    entries = LedgerEntry.objects.filter(account__customer_id=customer.pk).select_related("transaction")
    if asset_code:
        entries = entries.filter(asset_id=asset_code)
    if created_gte is not None:
        entries = entries.filter(created__gte=created_gte)
    if created_lt is not None:
        entries = entries.filter(created__lt=created_lt)
    return entries.order_by("-created", "-id") if newest_first else entries.order_by("created", "id")


def _scope(**filters: str | None) -> dict[str, str]:
    """The filters that are set. An unscoped list is refused rather than leaking every row."""
    scope = {name: value for name, value in filters.items() if value}
    if not scope:
        raise ValueError("a list of money objects needs a principal's scope")
    return scope


def payment_get(
    *, payment_id: str, merchant_id: str | None = None, terminal_id: str | None = None, store_id: str | None = None, customer_id: str | None = None
) -> Payment:
    """A payment visible to the given principal scope; another principal's payment is NotFound."""
    payments = payments_list(merchant_id=merchant_id, terminal_id=terminal_id, store_id=store_id, customer_id=customer_id)
    return _one(payments.filter(pk=payment_id), missing="no such payment", param="payment")


def payments_list(
    *,
    merchant_id: str | None = None,
    terminal_id: str | None = None,
    store_id: str | None = None,
    customer_id: str | None = None,
    asset_code: str | None = None,
) -> QuerySet[Payment]:
    """Payments in a principal's scope, newest first (ordered by -created, -id)."""
    payments = Payment.objects.filter(**_scope(merchant_id=merchant_id, terminal_id=terminal_id, store_id=store_id, customer_id=customer_id))
    if asset_code:
        payments = payments.filter(asset_id=asset_code)
    return payments.order_by("-created", "-id")


def refund_get(*, refund_id: str, merchant_id: str | None = None, customer_id: str | None = None) -> Refund:
    refunds = refunds_list(merchant_id=merchant_id, customer_id=customer_id)
    return _one(refunds.filter(pk=refund_id), missing="no such refund", param="refund")


def payment_intent_get(*, intent_id: str, merchant_id: str) -> PaymentIntent:
    return _one(payment_intents_list(merchant_id=merchant_id).filter(pk=intent_id), missing="no such payment intent", param="payment_intent")


def payment_intents_list(*, merchant_id: str) -> QuerySet[PaymentIntent]:
    """With each one's payment (its fee and net are shown)."""
    return PaymentIntent.objects.filter(merchant_id=merchant_id).select_related("payment").order_by("-created", "-id")


def fee_schedules_list() -> QuerySet[FeeSchedule]:
    return FeeSchedule.objects.order_by("-created", "-id")


def fee_schedule_get(*, fee_schedule_id: str) -> FeeSchedule:
    return _one(FeeSchedule.objects.filter(pk=fee_schedule_id), missing="no such fee schedule", param="fee_schedule")


@dataclass(frozen=True)
class FeeTerms:
    """One fee schedule, as the payment path reads it."""

    schedule_id: str
    merchant_id: str | None
    valid_from: datetime
    rate: Decimal
    rounding: str
    fixed: int

    def fee_of(self, amount: int) -> int:
        return fee_for(amount=amount, rate=self.rate, rounding=self.rounding, fixed=self.fixed)


# Per process: (schema, asset, merchant) -> (expiry on the monotonic clock, the merchant's
# and the tenant-wide schedules, latest start first). A payment reads no schedule from the
# database: a new one starts no sooner than every process's cache has expired
# (`fee_schedule_earliest_start`), and schedules are never edited.
_FEE_TERMS: dict[tuple[str, str, str], tuple[float, tuple[FeeTerms, ...]]] = {}
_FEE_TERMS_MAX = 4_096


def fee_schedule_earliest_start(*, now: datetime) -> datetime:
    """The earliest `valid_from` a schedule added now may have."""
    lead = float(settings.TALLY_FEE_SCHEDULE_CACHE_SECONDS) + float(settings.TALLY_FEE_SCHEDULE_GRACE_SECONDS)
    return now + timedelta(seconds=lead)


def fee_terms_in_force(*, merchant_id: str, asset_code: str, at: datetime) -> FeeTerms | None:
    """The merchant's own schedule in force at `at` (the latest `valid_from` <= at), else the
    tenant-wide one, else None (no fee). Cached per process (above)."""
    key = (str(getattr(connection, "schema_name", "")), asset_code, merchant_id)
    now = monotonic()
    hit = _FEE_TERMS.get(key)
    if hit is None or hit[0] <= now:
        rows = FeeSchedule.objects.filter(Q(merchant_id=merchant_id) | Q(merchant__isnull=True), asset_id=asset_code).order_by("-valid_from")
        terms = tuple(FeeTerms(*row) for row in rows.values_list("id", "merchant_id", "valid_from", "rate", "rounding", "fixed"))
        if len(_FEE_TERMS) >= _FEE_TERMS_MAX:
            _FEE_TERMS.clear()  # bounded; the busiest merchants come back at their next payment
        hit = _FEE_TERMS[key] = (now + float(settings.TALLY_FEE_SCHEDULE_CACHE_SECONDS), terms)
    in_force = [terms for terms in hit[1] if terms.valid_from <= at]
    return next((terms for terms in in_force if terms.merchant_id is not None), in_force[0] if in_force else None)


def fee_terms_forget() -> None:
    """Drop this process's cached schedules (a schedule added here; tests)."""
    _FEE_TERMS.clear()


def transfer_get(*, transfer_id: str, customer_id: str) -> Transfer:
    """A transfer the customer sent or received."""
    return _one(transfers_list(customer_id=customer_id).filter(pk=transfer_id), missing="no such transfer", param="transfer")


def topup_get(*, topup_id: str, customer_id: str | None = None) -> TopUp:
    topups = TopUp.objects.filter(pk=topup_id)
    return _one(topups.filter(customer_id=customer_id) if customer_id else topups, missing="no such top-up", param="topup")


def refunds_list(*, merchant_id: str | None = None, customer_id: str | None = None, store_id: str | None = None) -> QuerySet[Refund]:
    scope = _scope(payment__merchant_id=merchant_id, payment__customer_id=customer_id, payment__store_id=store_id)
    return Refund.objects.select_related("payment").filter(**scope)


def transfers_list(*, customer_id: str) -> QuerySet[Transfer]:
    return Transfer.objects.filter(Q(from_customer_id=customer_id) | Q(to_customer_id=customer_id))


def topups_list(*, customer_id: str) -> QuerySet[TopUp]:
    return TopUp.objects.filter(customer_id=customer_id)


def adjustments_list() -> QuerySet[Adjustment]:
    return Adjustment.objects.all()


def adjustment_get(*, adjustment_id: str) -> Adjustment:
    return _one(Adjustment.objects.filter(pk=adjustment_id), missing="no such adjustment", param=None)


def pending_adjustments_list(*, status: str | None = None) -> QuerySet[PendingAdjustment]:
    qs = PendingAdjustment.objects.all()
    return qs.filter(status=status) if status else qs


def pending_adjustment_get(*, pending_id: str, param: str | None = None) -> PendingAdjustment:
    return _one(PendingAdjustment.objects.filter(pk=pending_id), missing="no such pending adjustment", param=param)


def payment_token_resolve(*, token: object) -> Customer:
    """The customer a live, unused token belongs to, else NotFound(param="customer_token")."""
    if not payment_token_is_well_formed(token):
        raise NotFound("invalid or expired payment token", param="customer_token")
    live = PaymentToken.objects.filter(token_hash=payment_token_hash(str(token)), used_at__isnull=True, expires_at__gt=timezone.now())
    return _one(live.select_related("customer"), missing="invalid or expired payment token", param="customer_token").customer


def mandate_active_exists(*, customer_id: str, merchant_id: str) -> bool:
    return Mandate.objects.filter(customer_id=customer_id, merchant_id=merchant_id, revoked_at__isnull=True).exists()


def mandates_list(*, customer_id: str) -> QuerySet[Mandate]:
    return Mandate.objects.filter(customer_id=customer_id)


def mandate_get(*, mandate_id: str, customer_id: str) -> Mandate:
    return _one(Mandate.objects.filter(pk=mandate_id, customer_id=customer_id), missing="no such mandate", param="mandate")


def gateway_account_get(*, gateway: str) -> GatewayAccount:
    return _one(GatewayAccount.objects.filter(gateway=gateway), missing="no such gateway", param="gateway")


def gateway_account_active() -> GatewayAccount | None:
    """The gateway the tenant's card top-ups use, or None."""
    return GatewayAccount.objects.filter(active=True).first()


@dataclass(frozen=True)
class TopUpCursor:
    """The last top-up of a page, for the next page of a list in (created, id) order."""

    created: datetime
    id: str

    @classmethod
    def of(cls, topup: TopUp) -> TopUpCursor:
        return cls(created=topup.created, id=topup.pk)


def topups_page(topups: QuerySet[TopUp], *, after: TopUpCursor | None, before: TopUpCursor | None, limit: int) -> list[TopUp]:
    """One page of `topups`, oldest first, strictly between the bounds."""
    # Keyset, not OFFSET: rows settled between two pages neither shift nor skip one. The
    # bounds are compared in SQL, in the database's collation, the order the pages come in.
    if after is not None:
        topups = topups.filter(Q(created__gt=after.created) | Q(created=after.created, id__gt=after.id))
    if before is not None:
        topups = topups.filter(Q(created__lt=before.created) | Q(created=before.created, id__lt=before.id))
    return list(topups.order_by("created", "id")[:limit])


def topups_recoverable(*, created_before: datetime | None = None) -> QuerySet[TopUp]:
    """Pending card top-ups not waiting for an operator (created before `created_before`)."""
    pending = TopUp.objects.filter(status=TopUpStatus.PENDING, operator_review_at__isnull=True).exclude(claim_key="")
    return pending if created_before is None else pending.filter(created__lt=created_before)


def topups_recovery_next_due_at(*, lease_seconds: int, now: datetime) -> datetime | None:
    """When the top-up recovery next has work in this tenant: `now` if a card refund is
    owed, else the oldest recoverable top-up's lease end, or None. Pending top-ups are read
    first: one that fails with a charge in between is then seen by the second read."""
    oldest = topups_recoverable().aggregate(oldest=Min("created"))["oldest"]
    if topups_charged_uncredited().exists():
        return now
    return oldest + timedelta(seconds=lease_seconds) if oldest is not None else None


def topups_pending_count() -> int:
    return TopUp.objects.filter(status=TopUpStatus.PENDING).count()


def topups_operator_review_count() -> int:
    """The operator queue: pending top-ups the recovery may not ask the PSP about again."""
    return TopUp.objects.filter(status=TopUpStatus.PENDING, operator_review_at__isnull=False).count()


def topups_charged_uncredited() -> QuerySet[TopUp]:
    """Failed top-ups the PSP holds a charge for whose card refund is not recorded yet."""
    return TopUp.objects.filter(status=TopUpStatus.FAILED, psp_charged=True, psp_refund_reference="")


@dataclass(frozen=True)
class TopUpQueue:
    """A tenant's card top-ups that still hold or owe card money, for the platform admin."""

    pending: int
    operator_review: int  # the operator queue among them
    refunds_owed: int
    oldest: list[TopUp]  # pending or refund owed, oldest first, at most the limit asked for


def topup_queue(*, limit: int = 50) -> TopUpQueue:
    """The current tenant's pending top-ups and card refunds owed, counted, and the oldest `limit`."""
    waiting = TopUp.objects.filter(status=TopUpStatus.PENDING) | topups_charged_uncredited()
    return TopUpQueue(
        pending=topups_pending_count(), operator_review=topups_operator_review_count(), refunds_owed=topups_charged_uncredited().count(),
        oldest=list(waiting.select_related("asset").order_by("created", "id")[:limit]),
    )


@dataclass(frozen=True)
class TopUpSettlementLine:
    topup_id: str
    psp_reference: str
    gateway: str
    asset: str
    amount: int  # what the PSP charged (the bonus is ours, never the card's)
    refunded: bool


def topup_settlement_lines(*, day: date, gateway: str | None = None) -> list[TopUpSettlementLine]:
    """Our card top-ups the PSP charged on `day` (UTC, the PSP's charge time), credited or
    not, for the settlement comparison."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    topups = TopUp.objects.filter(psp_charged=True, psp_charged_at__gte=start, psp_charged_at__lt=start + timedelta(days=1))
    if gateway is not None:
        topups = topups.filter(gateway=gateway)
    return [
        TopUpSettlementLine(
            topup_id=t.pk, psp_reference=t.psp_reference, gateway=t.gateway, asset=t.asset_id, amount=t.amount,
            refunded=bool(t.psp_refund_reference),
        )
        for t in topups.order_by("psp_charged_at", "id")
    ]


@dataclass(frozen=True)
class SoloPostings:
    """What one staff member posted alone (no second approver) in one asset within a window:
    in all (`total`, across every party) and to one party (`to_party`)."""

    total: int
    to_party: int


def staff_solo_postings_total(
    *, staff: StaffMember, asset_code: str, since: datetime, customer: Customer | None = None, merchant: Merchant | None = None
) -> SoloPostings:
    """What `staff` posted alone (adjustments without an approval) in `asset_code` since
    `since`, across every party and to the given one, credits and debits alike (a debit
    undoes no credit's risk), in one query. A new kind of solo staff posting adds its sum here."""
    party = Q(customer=customer, merchant=merchant) if customer is not None or merchant is not None else Q(pk__in=[])
    sums = Adjustment.objects.filter(staff=staff, asset_id=asset_code, created__gte=since, approval__isnull=True).aggregate(
        total=Sum("amount"), to_party=Sum("amount", filter=party)
    )
    # Payouts a staff member approved (or retried) alone: money leaving on one person's word.
    payouts = Payout.objects.filter(approved_by=staff, approval_maker__isnull=True, asset_id=asset_code, approved_at__gte=since).aggregate(
        total=Sum("amount"), to_party=Sum("amount", filter=Q(merchant=merchant) if merchant is not None else Q(pk__in=[]))
    )
    return SoloPostings(
        total=int(sums["total"] or 0) + int(payouts["total"] or 0), to_party=int(sums["to_party"] or 0) + int(payouts["to_party"] or 0)
    )


def bank_account_of(*, merchant_id: str) -> MerchantBankAccount | None:
    return MerchantBankAccount.objects.filter(merchant_id=merchant_id).first()


def payout_get(*, payout_id: str, merchant_id: str) -> Payout:
    return _one(Payout.objects.filter(pk=payout_id, **_scope(merchant_id=merchant_id)), missing="no such payout", param="payout")


def payouts_list(*, merchant_id: str, asset_code: str | None = None, status: str | None = None) -> QuerySet[Payout]:
    payouts = Payout.objects.filter(**_scope(merchant_id=merchant_id))
    if asset_code:
        payouts = payouts.filter(asset_id=asset_code)
    if status:
        payouts = payouts.filter(status=status)
    return payouts.order_by("-created", "-id")


# Payouts the saga moves on its own: none in the operator queue, none whose money is owed back.
_SAGA_OWNS = Q(review_at__isnull=True, return_owed_at__isnull=True)


def _pending_to_send() -> QuerySet[Payout]:
    """Pending payouts the PSP may be asked to make: approved or needing no approval, of a
    merchant whose payouts are not held and whose account is not frozen."""
    return (
        Payout.objects.filter(_SAGA_OWNS, status=PayoutStatus.PENDING, merchant__payouts_held=False, merchant__account__frozen=False)
        .filter(Q(approval_required=False) | Q(approved_at__isnull=False))
    )


def payouts_sendable(*, created_before: datetime, now: datetime) -> QuerySet[Payout]:
    """Pending payouts the PSP may be asked to make now (`_pending_to_send`) made before
    `created_before`, with no live lease, oldest first."""
    return (
        _pending_to_send().filter(created__lt=created_before)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .order_by("created", "id")
    )


def payouts_to_check(*, now: datetime, check_every: timedelta) -> QuerySet[Payout]:
    """In-transit payouts past the PSP's promise, not asked about within `check_every`:
    their webhook may be lost, so the recovery asks the PSP."""
    return (
        Payout.objects.filter(_SAGA_OWNS, status=PayoutStatus.IN_TRANSIT)
        .filter(Q(arrival_expected_at__isnull=True) | Q(arrival_expected_at__lte=now))
        .filter(Q(psp_checked_at__isnull=True) | Q(psp_checked_at__lte=now - check_every))
        .order_by("arrival_expected_at", "id")
    )


def payouts_returns_owed(*, now: datetime, retry_after: timedelta) -> QuerySet[Payout]:
    """Payouts the PSP failed after it had them whose money it has not given back yet (not
    in the operator queue), not tried within `retry_after`, oldest first."""
    return (
        Payout.objects.filter(return_owed_at__isnull=False, review_at__isnull=True)
        .filter(Q(psp_checked_at__isnull=True) | Q(psp_checked_at__lte=now - retry_after))
        .order_by("return_owed_at", "id")
    )


def payouts_recovery_next_due_at(*, lease_seconds: int, check_every: timedelta, now: datetime) -> datetime | None:
    """When the payout recovery next has work: the oldest sendable payout's lease end (or
    its creation plus a lease, when the task sent on commit had its chance), the next try
    of a return owed (a lease after the last), or the first in-transit payout past its
    promise and its last check; None if none."""
    lease = timedelta(seconds=lease_seconds)
    pending = _pending_to_send().aggregate(due=Min(Coalesce("lease_expires_at", F("created") + lease)))["due"]
    returns = Payout.objects.filter(return_owed_at__isnull=False, review_at__isnull=True).aggregate(
        due=Min(Coalesce(F("psp_checked_at") + lease, "return_owed_at")),
    )["due"]
    checks = Payout.objects.filter(_SAGA_OWNS, status=PayoutStatus.IN_TRANSIT).aggregate(
        due=Min(Greatest(Coalesce("arrival_expected_at", F("created") + check_every), Coalesce(F("psp_checked_at") + check_every, now))),
    )["due"]
    return min((d for d in (pending, returns, checks) if d is not None), default=None)


def payouts_in_review() -> QuerySet[Payout]:
    """The operator queue: payouts the saga stopped for a person, oldest first."""
    return Payout.objects.filter(review_at__isnull=False).order_by("review_at", "id")


def payouts_in_transit_overdue(*, now: datetime, limit: int = 50) -> QuerySet[Payout]:
    """The queue of payouts in transit longer than the PSP promised, oldest promise first."""
    return Payout.objects.filter(status=PayoutStatus.IN_TRANSIT, arrival_expected_at__lt=now).order_by("arrival_expected_at", "id")[:limit]


@dataclass(frozen=True)
class PayoutSettlementLine:
    payout_id: str
    psp_reference: str
    asset: str
    amount: int


def payout_settlement_lines(*, day: date, gateway: str | None = None) -> list[PayoutSettlementLine]:
    """Our payouts the PSP made on `day` (UTC, the PSP's time) and still holds as sent (in
    transit or paid), for the settlement comparison."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    payouts = Payout.objects.filter(
        status__in=[PayoutStatus.IN_TRANSIT, PayoutStatus.PAID], psp_created_at__gte=start, psp_created_at__lt=start + timedelta(days=1)
    )
    if gateway is not None:
        payouts = payouts.filter(gateway=gateway)
    return [
        PayoutSettlementLine(payout_id=p.pk, psp_reference=p.psp_reference, asset=p.asset_id, amount=p.amount)
        for p in payouts.order_by("psp_created_at", "id")
    ]


def payout_destinations_page(*, gateway: str, after: str, limit: int) -> list[tuple[str, str]]:
    """(merchant id, bank account reference) of up to `limit` merchants with a bank account at
    `gateway`, in merchant id order from after `after`, going round to the first ones when
    the end comes first: a rotating page, each merchant's turn coming again."""
    accounts = MerchantBankAccount.objects.filter(gateway=gateway).order_by("merchant_id").values_list("merchant_id", "psp_reference")
    rows = list(accounts.filter(merchant_id__gt=after)[:limit])
    if len(rows) < limit and after:
        rows += list(accounts.filter(merchant_id__lte=after)[:limit - len(rows)])
    return [(str(merchant), str(reference)) for merchant, reference in rows]


@dataclass(frozen=True)
class HeldAtPspExplained:
    """What a merchant's unfinished payouts at a gateway explain the PSP holding on the way to
    its bank account, per asset: `unsettled`, the payouts whose money may be there (sent and
    not yet paid out by the PSP, failed with the money owed back, or in the operator queue);
    `in_transit`, the payouts the PSP is paying out, whose money is there again only if one
    failed and its word has not reached us yet."""

    unsettled: dict[str, int]
    in_transit: dict[str, int]


def payouts_held_at_psp_explained(*, merchant_ids: list[str], gateway: str) -> dict[str, HeldAtPspExplained]:
    """Per merchant of `merchant_ids`, what its unfinished payouts at `gateway` explain (HeldAtPspExplained)."""
    unsettled = (
        Q(status=PayoutStatus.PENDING, attempts__gt=0) | Q(return_owed_at__isnull=False)
        | Q(review_at__isnull=False, status__in=[PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT, PayoutStatus.PAID])
    )
    rows = (
        Payout.objects.filter(merchant_id__in=merchant_ids, gateway=gateway).filter(unsettled | Q(status=PayoutStatus.IN_TRANSIT))
        .values("merchant_id", "asset_id")
        .annotate(unsettled=Sum("amount", filter=unsettled, default=0), in_transit=Sum("amount", filter=~unsettled, default=0))
    )
    found: dict[str, HeldAtPspExplained] = {}
    for row in rows:
        explained = found.setdefault(str(row["merchant_id"]), HeldAtPspExplained(unsettled={}, in_transit={}))
        explained.unsettled[str(row["asset_id"])] = int(row["unsettled"])
        explained.in_transit[str(row["asset_id"])] = int(row["in_transit"])
    return found


@dataclass(frozen=True)
class PayoutQueues:
    """The payouts stuck for a person or the PSP: in the operator queue, and owing money back
    (not in the queue), each with its oldest's time."""

    operator_review: int
    operator_review_oldest: datetime | None
    returns_owed: int
    returns_owed_oldest: datetime | None


def payout_queues() -> PayoutQueues:
    review = Payout.objects.filter(review_at__isnull=False).aggregate(n=Count("pk"), oldest=Min("review_at"))
    owed = Payout.objects.filter(return_owed_at__isnull=False, review_at__isnull=True).aggregate(n=Count("pk"), oldest=Min("return_owed_at"))
    return PayoutQueues(operator_review=int(review["n"]), operator_review_oldest=review["oldest"], returns_owed=int(owed["n"]),
                        returns_owed_oldest=owed["oldest"])


def payouts_returns_owed_since(*, before: datetime) -> QuerySet[Payout]:
    """Payouts owing their money back (not in the operator queue) since before `before`, oldest first."""
    return Payout.objects.filter(return_owed_at__lt=before, review_at__isnull=True).order_by("return_owed_at", "id")


def payouts_in_review_since(*, before: datetime) -> QuerySet[Payout]:
    """Payouts in the operator queue since before `before`, oldest first."""
    return Payout.objects.filter(review_at__lt=before).order_by("review_at", "id")


def payouts_in_transit_totals() -> dict[str, int]:
    """Per asset, what payouts not yet paid, failed or canceled hold: what the in-transit account should."""
    rows = Payout.objects.filter(status__in=[PayoutStatus.PENDING, PayoutStatus.IN_TRANSIT]).values("asset_id").annotate(total=Sum("amount"))
    return {str(row["asset_id"]): int(row["total"]) for row in rows}


def payout_statuses(*, payout_ids: list[str]) -> list[tuple[str, str]]:
    """(id, status) of those of `payout_ids` that are payouts of ours."""
    return [(str(pk), str(status)) for pk, status in Payout.objects.filter(pk__in=payout_ids).values_list("pk", "status")]
