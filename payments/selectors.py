"""Reads for the faces: balances, ledger history, payment lookups scoped to a principal.

Balances are exact at every read: the SUM over an account's shard rows, in one query.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from django.db.models import Q, QuerySet, Sum

from payments.errors import NotFound
from payments.models import Payment, PaymentIntent, Refund, TopUp, Transfer
from wallets.models import Account, Asset, Balance, CarbonImpact, Customer, LedgerEntry, Merchant


class BalanceLine(TypedDict):
    asset: str
    balance: int
    available: int
    held: int


def _balances(account: Account) -> list[BalanceLine]:
    totals = {
        row["asset_id"]: (int(row["balance"]), int(row["held"]))
        for row in Balance.objects.filter(account=account).values("asset_id").annotate(balance=Sum("balance"), held=Sum("held"))
    }
    lines: list[BalanceLine] = []
    # Every asset of the tenant, main currency first, so a new wallet shows its zeros.
    for code in Asset.objects.order_by("-is_main", "code").values_list("code", flat=True):
        balance, held = totals.get(code, (0, 0))
        lines.append({"asset": code, "balance": balance, "available": balance - held, "held": held})
    return lines


def wallet_balances(*, customer: Customer) -> list[BalanceLine]:
    return _balances(Account.objects.get(customer_id=customer.pk))


def merchant_balances(*, merchant: Merchant) -> list[BalanceLine]:
    return _balances(Account.objects.get(merchant_id=merchant.pk))


def carbon_impact_grams(*, customer: Customer | None = None, merchant: Merchant | None = None) -> int:
    """Net grams of CO2 recorded for a customer's or a merchant's payments (after refunds)."""
    account = Account.objects.get(customer_id=customer.pk) if customer is not None else Account.objects.get(merchant_id=getattr(merchant, "pk", None))
    return int(CarbonImpact.objects.filter(account=account).aggregate(total=Sum("grams"))["total"] or 0)


def ledger_entries_for_customer(
    *,
    customer: Customer,
    asset_code: str | None = None,
    created_gte: datetime | None = None,
    created_lt: datetime | None = None,
    newest_first: bool = True,
) -> QuerySet[LedgerEntry]:
    """The customer's ledger entries, ordered by (created, id) (newest first by default):
    a stable total order for cursor pagination on (created, id)."""
    entries = LedgerEntry.objects.filter(account__customer_id=customer.pk).select_related("transaction")
    if asset_code:
        entries = entries.filter(asset_id=asset_code)
    if created_gte is not None:
        entries = entries.filter(created__gte=created_gte)
    if created_lt is not None:
        entries = entries.filter(created__lt=created_lt)
    return entries.order_by("-created", "-id") if newest_first else entries.order_by("created", "id")


def payment_get(
    *, payment_id: str, merchant_id: str | None = None, terminal_id: str | None = None, store_id: str | None = None, customer_id: str | None = None
) -> Payment:
    """A payment visible to the given principal scope; another principal's payment is NotFound."""
    payments = payments_list(merchant_id=merchant_id, terminal_id=terminal_id, store_id=store_id, customer_id=customer_id)
    payment = payments.filter(pk=payment_id).first()
    if payment is None:
        raise NotFound("no such payment", param="payment")
    return payment


def payments_list(
    *, merchant_id: str | None = None, terminal_id: str | None = None, store_id: str | None = None, customer_id: str | None = None
) -> QuerySet[Payment]:
    """Payments in a principal's scope, newest first (ordered by -created, -id). At least one
    scope is required: an unscoped list is refused rather than leaking every payment."""
    if not any((merchant_id, terminal_id, store_id, customer_id)):
        raise ValueError("payments_list needs a scope")
    payments = Payment.objects.all()
    if merchant_id:
        payments = payments.filter(merchant_id=merchant_id)
    if terminal_id:
        payments = payments.filter(terminal_id=terminal_id)
    if store_id:
        payments = payments.filter(store_id=store_id)
    if customer_id:
        payments = payments.filter(customer_id=customer_id)
    return payments.order_by("-created", "-id")


def refund_get(*, refund_id: str, merchant_id: str | None = None, customer_id: str | None = None) -> Refund:
    refunds = Refund.objects.select_related("payment")
    if merchant_id:
        refunds = refunds.filter(payment__merchant_id=merchant_id)
    if customer_id:
        refunds = refunds.filter(payment__customer_id=customer_id)
    if not (merchant_id or customer_id):
        raise ValueError("refund_get needs a scope")
    refund = refunds.filter(pk=refund_id).first()
    if refund is None:
        raise NotFound("no such refund", param="refund")
    return refund


def refunds_for_payment(*, payment: Payment) -> QuerySet[Refund]:
    return Refund.objects.filter(payment=payment).order_by("-created", "-id")


def payment_intent_get(*, intent_id: str, merchant_id: str) -> PaymentIntent:
    intent = PaymentIntent.objects.filter(pk=intent_id, merchant_id=merchant_id).first()
    if intent is None:
        raise NotFound("no such payment intent", param="payment_intent")
    return intent


def payment_intents_list(*, merchant_id: str) -> QuerySet[PaymentIntent]:
    return PaymentIntent.objects.filter(merchant_id=merchant_id).order_by("-created", "-id")


def transfer_get(*, transfer_id: str, customer_id: str) -> Transfer:
    """A transfer the customer sent or received."""
    transfer = Transfer.objects.filter(Q(from_customer_id=customer_id) | Q(to_customer_id=customer_id), pk=transfer_id).first()
    if transfer is None:
        raise NotFound("no such transfer", param="transfer")
    return transfer


def topup_get(*, topup_id: str, customer_id: str | None = None) -> TopUp:
    topups = TopUp.objects.filter(pk=topup_id)
    if customer_id:
        topups = topups.filter(customer_id=customer_id)
    topup = topups.first()
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    return topup
