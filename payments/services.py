"""THE payments service module: every face, the admin and the Celery tasks move money here.

Each public function is one database transaction through payments.db.run_atomic. When the
caller already holds a transaction (the idempotency layer: claim + effect + outbox +
stored response commit together), the ORM-path services run in a savepoint, so a
business refusal (402) undoes any partial write and leaves the caller's transaction
usable to store the refusal. The payment hot path refuses before it writes, so it needs
no savepoint. Database errors are never swallowed: conflicts propagate to whoever owns
the outermost transaction, which retries them.

Rates come from the current tenant (`connection.tenant`), rounding modes in payments.money.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
from collections.abc import Callable, Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar, cast

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from payments import selectors as payment_selectors
from payments.db import run_atomic, run_single_statement
from payments.errors import (
    AmountInvalid,
    AssetUnknown,
    CapExceeded,
    InsufficientFunds,
    InvalidState,
    NotFound,
    RefundWindowClosed,
    TallyError,
    WalletFrozen,
)
from payments.models import (
    Adjustment,
    AdjustmentDirection,
    CaptureMethod,
    OutboxEvent,
    Payment,
    PaymentIntent,
    PaymentIntentStatus,
    PaymentStatus,
    PaymentToken,
    Refund,
    TopUp,
    TopUpStatus,
    Transfer,
)
from payments.money import amount_to_minor, carbon_grams_for, points_for, proportion_floor, topup_bonus_for
from tenants.models import Tenant
from wallets import ids
from wallets.models import (
    BALANCE_SHARDS,
    CARBON_ASSET,
    POINTS_ASSET,
    Account,
    Asset,
    Customer,
    HoldStatus,
    LedgerTransactionKind,
    Merchant,
    StaffMember,
    SystemRole,
    Terminal,
)
from wallets.services.ledger import (
    Leg,
    account_balance,
    customer_balance_row_lock,
    hold_place,
    hold_release,
    ledger_post,
    lock_key,
    system_account,
)

T = TypeVar("T")

PAYMENT_TOKEN_TTL = timedelta(seconds=120)
PAYMENT_TOKEN_PREFIX = "ptok_"  # noqa: S105 - a prefix, not a secret
PAYMENT_TOKEN_RANDOM_LENGTH = 32


# --- Plumbing -------------------------------------------------------------------------


def _run(fn: Callable[[], T], *, operation: str) -> T:
    """One transaction via run_atomic; a savepoint when nested (see the module docstring)."""
    if connection.in_atomic_block:

        def in_savepoint() -> T:
            with transaction.atomic():
                return fn()

        return run_atomic(in_savepoint, operation=operation)
    return run_atomic(fn, operation=operation)


def _current_tenant() -> Tenant:
    """The tenant whose schema is active. connection.tenant is the real row when set by the
    middleware or set_tenant; under schema_context it is a stand-in without settings."""
    tenant = getattr(connection, "tenant", None)
    if isinstance(tenant, Tenant):
        return tenant
    schema_name: str = getattr(connection, "schema_name")  # noqa: B009 - set by django-tenants' backend
    return cast(Tenant, Tenant.objects.get(schema_name=schema_name))


def _rate(tenant: Tenant, name: str) -> Decimal:
    value = getattr(tenant, name)
    if isinstance(value, float):
        raise TypeError(f"tenant setting {name} is a float")
    return Decimal(value)


def _asset_get(asset_code: object, *, param: str = "asset") -> Asset:
    if not isinstance(asset_code, str) or not asset_code:
        raise AssetUnknown(param=param)
    asset = Asset.objects.filter(code=asset_code).first()
    if asset is None:
        raise AssetUnknown(f"unknown asset: {asset_code[:20]}", param=param)
    return asset


def _account_of(party: Customer | Merchant) -> Account:
    if isinstance(party, Customer):
        return Account.objects.get(customer_id=party.pk)
    return Account.objects.get(merchant_id=party.pk)


def outbox_event_create(*, topic: str, payload: Mapping[str, Any]) -> OutboxEvent:
    """Record an event in the caller's transaction (the relay publishes it after commit)."""
    return OutboxEvent.objects.create(topic=topic, payload=dict(payload), created=timezone.now())


def _ts(value: Any) -> int:
    return int(value.timestamp())


# --- Payments (the hot path) ------------------------------------------------------------

_REFUSALS: dict[str, Callable[[], TallyError]] = {
    "insufficient_funds": lambda: InsufficientFunds("insufficient funds", param="amount"),
    "wallet_frozen": lambda: WalletFrozen("the wallet is frozen", param=None),
    "asset_unknown": lambda: AssetUnknown(param="asset"),
    "customer_missing": lambda: NotFound("no such customer", param="customer"),
    "merchant_missing": lambda: NotFound("no such terminal or merchant", param="terminal"),
}


def _charge(
    *,
    customer_id: str,
    terminal_id: str | None,
    merchant_id: str | None,
    asset_code: str,
    amount: int,
) -> Payment:
    """Customer -> merchant in one SQL statement (tally_payment_create, payments/migrations/0002).

    Locks: the customer's rows (asset, then CARBON, POINT), one merchant shard, one shard of
    the bonus pool and of the carbon registry, then the carbon aggregates. Sends exactly one
    statement, which is atomic by itself (see payments.db.run_single_statement).
    """
    tenant = _current_tenant()
    rewarded = asset_code == tenant.main_currency
    points = points_for(amount=amount, rate=_rate(tenant, "points_earn_rate")) if rewarded else 0
    grams = carbon_grams_for(amount=amount, grams_per_unit=_rate(tenant, "carbon_grams_per_unit")) if rewarded else 0
    payment_id = ids.new_payment_id()
    txn_id = ids.new_ledger_transaction_id()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM tally_payment_create(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                payment_id, txn_id, ids.new_event_id(), customer_id, terminal_id, merchant_id,
                asset_code, amount, points, grams, POINTS_ASSET, CARBON_ASSET, BALANCE_SHARDS, timezone.now(),
            ],
        )
        row = cursor.fetchone()
    assert row is not None
    code, merchant, store, points_earned, grams_recorded, created = row
    if code != "ok":
        raise _REFUSALS[code]()
    payment = Payment(
        id=payment_id,
        status=PaymentStatus.SUCCEEDED,
        customer_id=customer_id,
        merchant_id=merchant,
        store_id=store,
        terminal_id=terminal_id,
        asset_id=asset_code,
        amount=amount,
        points_earned=points_earned,
        carbon_grams=grams_recorded,
        ledger_transaction_id=txn_id,
        created=created,
    )
    payment._state.adding = False
    payment._state.db = "default"
    return payment


def payment_create(
    *, terminal: Terminal, customer: Customer | None = None, customer_id: str | None = None, asset_code: str, amount: object
) -> Payment:
    """Take a payment from `customer` at `terminal` (its store's merchant is paid).

    Earns points at the tenant's points_earn_rate (ROUND_FLOOR) and records carbon at
    carbon_grams_per_unit (ROUND_HALF_EVEN), both only for the main currency. Reward
    credits are limited to what fits under a capped reward asset. One SQL statement.
    Raises AmountInvalid, AssetUnknown, InsufficientFunds, WalletFrozen, NotFound.
    Pass `customer` or just its `customer_id`: the statement itself checks the customer
    exists (NotFound, param "customer"), so the API need not load it first.
    """
    minor = amount_to_minor(amount)
    if not isinstance(asset_code, str) or not asset_code:
        raise AssetUnknown(param="asset")
    if (customer is None) == (customer_id is None):
        raise TypeError("pass exactly one of customer and customer_id")
    payer_id = str(customer.pk) if customer is not None else str(customer_id)
    return run_single_statement(
        lambda: _charge(customer_id=payer_id, terminal_id=terminal.pk, merchant_id=None, asset_code=asset_code, amount=minor),
        operation="payment_create",
    )


def refund_create(*, payment: Payment, amount: object, reason: str = "") -> Refund:
    """Refund part or all of a payment, never more than is left; repeatable.

    Points and carbon go back in proportion: cumulative floor(earned x refunded / amount),
    so a full refund returns exactly what was earned; rewards the customer has already
    spent are not clawed below zero. Refused (CapExceeded) if the customer's wallet would
    exceed the asset's cap, (WalletFrozen) if frozen.
    Locks: the payment row, then ledger_post's balance locks (customer rows, every shard
    of the merchant's asset), then the carbon aggregates.
    """
    minor = amount_to_minor(amount)
    reason = str(reason)[:500]

    def body() -> Refund:
        locked = Payment.objects.filter(pk=payment.pk).order_by("pk").select_for_update().first()
        if locked is None:
            raise NotFound("no such payment", param="payment")
        if minor > locked.amount - locked.amount_refunded:
            raise AmountInvalid(f"amount exceeds what is left to refund ({locked.amount - locked.amount_refunded})", param="amount")
        customer_account = Account.objects.get(customer_id=locked.customer_id)
        merchant_account = Account.objects.get(merchant_id=locked.merchant_id)
        refunded_after = locked.amount_refunded + minor
        points_back = proportion_floor(total=locked.points_earned, part=refunded_after, whole=locked.amount) - locked.points_reversed
        grams_back = proportion_floor(total=locked.carbon_grams, part=refunded_after, whole=locked.amount) - locked.carbon_grams_reversed
        # Take back at most what the customer still has, read under lock: the customer's rows
        # are locked here, in lock order, so no concurrent spend can change them before
        # ledger_post (which would then refuse the refund with a stored 402).
        reversed_assets = [code for code, back in ((POINTS_ASSET, points_back), (CARBON_ASSET, grams_back)) if back > 0]
        available: dict[str, int] = {}
        for code in sorted({locked.asset_id, *reversed_assets}, key=lambda c: lock_key(account=customer_account, asset_code=c)):
            row = customer_balance_row_lock(account=customer_account, asset_code=code)
            available[code] = row.balance - row.held
        if points_back > 0:
            points_back = min(points_back, available[POINTS_ASSET])
        if grams_back > 0:
            grams_back = min(grams_back, available[CARBON_ASSET])
        refund_id = ids.new_refund_id()
        legs = [Leg(merchant_account, locked.asset_id, -minor), Leg(customer_account, locked.asset_id, minor)]
        if points_back > 0:
            legs += [Leg(customer_account, POINTS_ASSET, -points_back), Leg(system_account(role=SystemRole.BONUS_POOL), POINTS_ASSET, points_back)]
        if grams_back > 0:
            legs += [
                Leg(customer_account, CARBON_ASSET, -grams_back),
                Leg(system_account(role=SystemRole.CARBON_REGISTRY), CARBON_ASSET, grams_back),
            ]
        txn = ledger_post(kind=LedgerTransactionKind.REFUND, reference=refund_id, legs=legs)
        Payment.objects.filter(pk=locked.pk).update(
            amount_refunded=F("amount_refunded") + minor,
            points_reversed=F("points_reversed") + max(points_back, 0),
            carbon_grams_reversed=F("carbon_grams_reversed") + max(grams_back, 0),
        )
        if grams_back > 0:
            _carbon_impact_add(account=customer_account, shard=0, grams=-grams_back)
            _carbon_impact_add(account=merchant_account, shard=secrets.randbelow(BALANCE_SHARDS), grams=-grams_back)
        refund = Refund.objects.create(
            id=refund_id,
            payment=locked,
            amount=minor,
            reason=reason,
            points_reversed=max(points_back, 0),
            carbon_grams_reversed=max(grams_back, 0),
            ledger_transaction=txn,
        )
        outbox_event_create(
            topic="refund.succeeded",
            payload={
                "id": refund.id, "object": "refund", "payment": locked.id, "amount": minor, "asset": locked.asset_id,
                "merchant": locked.merchant_id, "customer": locked.customer_id, "reason": reason, "created": _ts(refund.created),
            },
        )
        payment.amount_refunded = locked.amount_refunded + minor
        return refund

    return _run(body, operation="refund_create")


def terminal_refund_create(*, terminal: Terminal, payment_id: str, amount: object, reason: str = "") -> Refund:
    """A terminal's refund: only of a payment of its own store, only on the day it was taken.

    NotFound (param "payment") for an unknown payment or another store's, so the two are
    indistinguishable (SPEC 4); RefundWindowClosed (409) for one not taken today, in the
    current time zone (`timezone.localdate`): older ones are refunded from the merchant
    account. Then exactly `refund_create`.
    """
    payment = payment_selectors.payment_get(payment_id=payment_id, store_id=terminal.store_id)
    if timezone.localdate(payment.created) != timezone.localdate():
        raise RefundWindowClosed("a terminal refunds only same-day payments; refund older ones from the merchant account", param="payment")
    return refund_create(payment=payment, amount=amount, reason=reason)


def _carbon_impact_add(*, account: Account, shard: int, grams: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO wallets_carbonimpact AS c (account_id, shard, grams) VALUES (%s, %s, %s) "
            "ON CONFLICT (account_id, shard) DO UPDATE SET grams = c.grams + EXCLUDED.grams",
            [account.id, shard, grams],
        )


# --- Transfers, top-ups, adjustments, freezes -------------------------------------------


def transfer_create(*, from_customer: Customer, to_customer: Customer, asset_code: str, amount: object) -> Transfer:
    """Move `amount` between two customers' wallets.

    Locks both customers' rows in account-id order (ledger_post), so A->B and B->A at once
    queue instead of deadlocking. Raises InsufficientFunds, CapExceeded, WalletFrozen.
    """
    minor = amount_to_minor(amount)
    if from_customer.pk == to_customer.pk:
        raise TallyError("cannot transfer to the same wallet", param="to_customer")

    def body() -> Transfer:
        asset = _asset_get(asset_code)
        source, target = _account_of(from_customer), _account_of(to_customer)
        transfer_id = ids.new_transfer_id()
        txn = ledger_post(
            kind=LedgerTransactionKind.TRANSFER, reference=transfer_id, legs=[Leg(source, asset.code, -minor), Leg(target, asset.code, minor)]
        )
        transfer = Transfer.objects.create(
            id=transfer_id, from_customer=from_customer, to_customer=to_customer, asset=asset, amount=minor, ledger_transaction=txn
        )
        outbox_event_create(
            topic="transfer.succeeded",
            payload={
                "id": transfer.id, "object": "transfer", "from_customer": from_customer.pk, "to_customer": to_customer.pk,
                "asset": asset.code, "amount": minor, "created": _ts(transfer.created),
            },
        )
        return transfer

    return _run(body, operation="transfer_create")


def topup_create(*, customer: Customer, asset_code: str, amount: object, payment_method: str) -> TopUp:
    """Record a card top-up as `pending` (the PSP is charged later, then topup_credit runs).

    Refuses early what the credit would refuse: frozen wallet, or the cap (amount + bonus).
    """
    minor = amount_to_minor(amount)
    if not isinstance(payment_method, str) or not payment_method.strip():
        raise TallyError("payment_method is required", param="payment_method")

    def body() -> TopUp:
        asset = _asset_get(asset_code)
        account = _account_of(customer)
        if account.frozen:
            raise WalletFrozen("the wallet is frozen", param=None)
        bonus = topup_bonus_for(amount=minor, rate=_rate(_current_tenant(), "topup_bonus_rate"))
        if asset.cap is not None:
            balance, _ = account_balance(account=account, asset_code=asset.code)
            if balance + minor + bonus > asset.cap:
                raise CapExceeded(f"the wallet's {asset.code} balance would exceed its cap of {asset.cap}", param="amount")
        topup = TopUp.objects.create(customer=customer, asset=asset, amount=minor, bonus_amount=bonus, payment_method=payment_method[:100])
        outbox_event_create(
            topic="topup.created",
            payload={"id": topup.id, "object": "topup", "customer": customer.pk, "asset": asset.code, "amount": minor, "status": topup.status},
        )
        return topup

    return _run(body, operation="topup_create")


def topup_credit(*, topup: TopUp) -> TopUp:
    """Credit a pending top-up from PSP funding, plus its bonus from the bonus pool.

    Idempotent: a top-up already credited is returned unchanged. The cap is enforced on
    amount + bonus atomically (CapExceeded; the caller then refunds the card).
    Locks: the top-up row, then the customer's balance row.
    """

    def body() -> TopUp:
        locked = TopUp.objects.filter(pk=topup.pk).order_by("pk").select_for_update().first()
        if locked is None:
            raise NotFound("no such top-up", param="topup")
        if locked.status == TopUpStatus.SUCCEEDED:
            return locked
        if locked.status != TopUpStatus.PENDING:
            raise InvalidState(f"top-up is {locked.status}", param=None)
        account = _account_of(locked.customer)
        legs = [Leg(system_account(role=SystemRole.PSP_FUNDING), locked.asset_id, -locked.amount), Leg(account, locked.asset_id, locked.amount)]
        if locked.bonus_amount > 0:
            legs += [
                Leg(system_account(role=SystemRole.BONUS_POOL), locked.asset_id, -locked.bonus_amount),
                Leg(account, locked.asset_id, locked.bonus_amount),
            ]
        txn = ledger_post(kind=LedgerTransactionKind.TOPUP, reference=locked.id, legs=legs)
        locked.status = TopUpStatus.SUCCEEDED
        locked.ledger_transaction = txn
        locked.save(update_fields=["status", "ledger_transaction", "updated"])
        outbox_event_create(
            topic="topup.succeeded",
            payload={
                "id": locked.id, "object": "topup", "customer": locked.customer_id, "asset": locked.asset_id,
                "amount": locked.amount, "bonus_amount": locked.bonus_amount, "status": locked.status,
            },
        )
        return locked

    result = _run(body, operation="topup_credit")
    topup.status, topup.ledger_transaction_id = result.status, result.ledger_transaction_id
    return result


def topup_fail(*, topup: TopUp, failure_code: str) -> TopUp:
    """Mark a pending top-up failed (the PSP declined). Locks: the top-up row."""

    def body() -> TopUp:
        locked = TopUp.objects.filter(pk=topup.pk).order_by("pk").select_for_update().get()
        if locked.status != TopUpStatus.PENDING:
            raise InvalidState(f"top-up is {locked.status}", param=None)
        locked.status, locked.failure_code = TopUpStatus.FAILED, failure_code[:50]
        locked.save(update_fields=["status", "failure_code", "updated"])
        outbox_event_create(topic="topup.failed", payload={"id": locked.id, "object": "topup", "failure_code": locked.failure_code})
        return locked

    return _run(body, operation="topup_fail")


def adjustment_create(
    *,
    staff: StaffMember,
    customer: Customer | None = None,
    merchant: Merchant | None = None,
    asset_code: str,
    amount: object,
    direction: str,
    reason: str,
) -> Adjustment:
    """A staff correction against the adjustments system account, with a reason.

    Works on frozen wallets (that is what staff corrections are for), but never takes a
    balance below zero or above the cap. Locks: see ledger_post.
    """
    minor = amount_to_minor(amount)
    if (customer is None) == (merchant is None):
        raise TallyError("give exactly one of customer or merchant", param="customer")
    if direction not in AdjustmentDirection.values:
        raise TallyError("direction must be credit or debit", param="direction")
    if not isinstance(reason, str) or not reason.strip():
        raise TallyError("a reason is required", param="reason")
    party: Customer | Merchant = customer if customer is not None else cast(Merchant, merchant)

    def body() -> Adjustment:
        asset = _asset_get(asset_code)
        account = _account_of(party)
        sign = 1 if direction == AdjustmentDirection.CREDIT else -1
        adjustment_id = ids.new_adjustment_id()
        txn = ledger_post(
            kind=LedgerTransactionKind.ADJUSTMENT,
            reference=adjustment_id,
            legs=[Leg(account, asset.code, sign * minor), Leg(system_account(role=SystemRole.ADJUSTMENTS), asset.code, -sign * minor)],
            allow_frozen=True,
        )
        adjustment = Adjustment.objects.create(
            id=adjustment_id, staff=staff, customer=customer, merchant=merchant, asset=asset, amount=minor,
            direction=direction, reason=reason[:500], ledger_transaction=txn,
        )
        outbox_event_create(
            topic="adjustment.created",
            payload={
                "id": adjustment.id, "object": "adjustment", "customer": customer.pk if customer else None,
                "merchant": merchant.pk if merchant else None, "asset": asset.code, "amount": minor,
                "direction": direction, "reason": adjustment.reason, "staff": staff.pk, "created": _ts(adjustment.created),
            },
        )
        return adjustment

    return _run(body, operation="adjustment_create")


def _freeze_set(*, customer: Customer, staff: StaffMember, reason: str, frozen: bool) -> Account:
    def body() -> Account:
        account = Account.objects.filter(customer_id=customer.pk).order_by("pk").select_for_update().get()
        account.frozen = frozen
        account.frozen_reason = reason[:500] if frozen else ""
        account.frozen_at = timezone.now() if frozen else None
        account.save(update_fields=["frozen", "frozen_reason", "frozen_at"])
        outbox_event_create(
            topic="wallet.frozen" if frozen else "wallet.unfrozen",
            payload={"object": "wallet", "customer": customer.pk, "staff": staff.pk, "reason": reason[:500]},
        )
        return account

    return _run(body, operation="wallet_freeze" if frozen else "wallet_unfreeze")


def wallet_freeze(*, customer: Customer, staff: StaffMember, reason: str) -> Account:
    """Freeze a customer's wallet: payments, transfers, refunds and top-ups are refused
    (WalletFrozen) until unfrozen; staff adjustments still work. Locks: the account row."""
    if not isinstance(reason, str) or not reason.strip():
        raise TallyError("a reason is required", param="reason")
    return _freeze_set(customer=customer, staff=staff, reason=reason, frozen=True)


def wallet_unfreeze(*, customer: Customer, staff: StaffMember, reason: str = "") -> Account:
    """Lift a freeze. Locks: the account row."""
    return _freeze_set(customer=customer, staff=staff, reason=str(reason), frozen=False)


# --- Payment intents (SPEC 7) --------------------------------------------------------------


def payment_intent_create(
    *, merchant: Merchant, customer: Customer, asset_code: str, amount: object, capture_method: str = CaptureMethod.AUTOMATIC
) -> PaymentIntent:
    minor = amount_to_minor(amount)
    if capture_method not in CaptureMethod.values:
        raise TallyError("capture_method must be automatic or manual", param="capture_method")

    def body() -> PaymentIntent:
        asset = _asset_get(asset_code)
        intent = PaymentIntent.objects.create(merchant=merchant, customer=customer, asset=asset, amount=minor, capture_method=capture_method)
        outbox_event_create(topic="payment_intent.created", payload=_intent_payload(intent))
        return intent

    return _run(body, operation="payment_intent_create")


def _intent_payload(intent: PaymentIntent) -> dict[str, Any]:
    return {
        "id": intent.id, "object": "payment_intent", "status": intent.status, "merchant": intent.merchant_id,
        "customer": intent.customer_id, "asset": intent.asset_id, "amount": intent.amount,
        "amount_captured": intent.amount_captured, "capture_method": intent.capture_method, "payment": intent.payment_id,
    }


def _intent_cas(intent: PaymentIntent, *, expected: tuple[str, ...], **changes: Any) -> PaymentIntent:
    """Compare-and-set: apply `changes` only if the row still has the caller's version and
    one of the `expected` statuses; bumps the version. Locks: the intent row (until commit)."""
    updated = PaymentIntent.objects.filter(pk=intent.pk, version=intent.version, status__in=expected).update(
        version=F("version") + 1, updated=timezone.now(), **changes
    )
    if updated != 1:
        current = PaymentIntent.objects.filter(pk=intent.pk).values_list("status", "version").first()
        if current is None:
            raise NotFound("no such payment intent", param="payment_intent")
        raise InvalidState(
            f"payment intent is {current[0]} (version {current[1]}); expected {' or '.join(expected)} at version {intent.version}", param=None
        )
    fresh = PaymentIntent.objects.get(pk=intent.pk)
    _intent_sync(intent, fresh)
    return fresh


_INTENT_STATE_FIELDS = ("status", "version", "amount", "amount_captured", "hold_id", "payment_id", "failure_code", "updated")


def _intent_sync(target: PaymentIntent, source: PaymentIntent) -> PaymentIntent:
    for field in _INTENT_STATE_FIELDS:
        setattr(target, field, getattr(source, field))
    return target


def _intent_run(intent: PaymentIntent, body: Callable[[PaymentIntent], PaymentIntent], *, operation: str) -> PaymentIntent:
    """Run `body` on a working copy of the caller's intent; the caller's object takes the new
    state only once the transaction succeeded (a refusal leaves it as it was)."""
    result = _run(lambda: body(copy.copy(intent)), operation=operation)
    _intent_sync(intent, result)
    return result


def payment_intent_update_amount(*, intent: PaymentIntent, amount: object) -> PaymentIntent:
    """Change the amount; only while `created` (else InvalidState, 409)."""
    minor = amount_to_minor(amount)
    return _intent_run(
        intent, lambda working: _intent_cas(working, expected=(PaymentIntentStatus.CREATED,), amount=minor), operation="payment_intent_update_amount"
    )


def payment_intent_confirm(*, intent: PaymentIntent) -> PaymentIntent:
    """Automatic capture: created -> charge_requested (the semantic lock) -> charged, or
    charge_failed (failure_code set, returned, not raised) on a business refusal.
    Manual capture: the same as payment_intent_authorize. Two concurrent confirms charge once:
    the loser's compare-and-set finds the version moved (InvalidState).
    Locks: the intent row, then the charge's balance rows (see _charge)."""
    if intent.capture_method == CaptureMethod.MANUAL:
        return payment_intent_authorize(intent=intent)

    def body(intent: PaymentIntent) -> PaymentIntent:
        locked = _intent_cas(intent, expected=(PaymentIntentStatus.CREATED,), status=PaymentIntentStatus.CHARGE_REQUESTED)
        try:
            # _charge refuses before it writes, so the failure can be recorded in this transaction.
            payment = _charge(
                customer_id=locked.customer_id, terminal_id=None, merchant_id=locked.merchant_id,
                asset_code=locked.asset_id, amount=locked.amount,
            )
        except (InsufficientFunds, WalletFrozen, AssetUnknown) as refusal:
            failed = _intent_cas(intent, expected=(PaymentIntentStatus.CHARGE_REQUESTED,), status=PaymentIntentStatus.CHARGE_FAILED,
                                 failure_code=refusal.code)
            outbox_event_create(topic="payment_intent.charge_failed", payload=_intent_payload(failed))
            return failed
        charged = _intent_cas(
            intent, expected=(PaymentIntentStatus.CHARGE_REQUESTED,), status=PaymentIntentStatus.CHARGED,
            payment_id=payment.pk, amount_captured=locked.amount,
        )
        outbox_event_create(topic="payment_intent.charged", payload=_intent_payload(charged))
        return charged

    return _intent_run(intent, body, operation="payment_intent_confirm")


def payment_intent_authorize(*, intent: PaymentIntent) -> PaymentIntent:
    """Manual capture: created -> authorized, holding the amount on the customer's wallet
    (available balance drops, balance does not). Raises InsufficientFunds / WalletFrozen.
    Locks: the intent row, then the customer's balance row."""
    if intent.capture_method != CaptureMethod.MANUAL:
        raise InvalidState("only manual-capture intents are authorized", param=None)

    def body(intent: PaymentIntent) -> PaymentIntent:
        _intent_cas(intent, expected=(PaymentIntentStatus.CREATED,), status=PaymentIntentStatus.AUTHORIZED)
        account = Account.objects.get(customer_id=intent.customer_id)
        if account.frozen:
            raise WalletFrozen("the wallet is frozen", param=None)
        hold = hold_place(account=account, asset_code=intent.asset_id, amount=intent.amount, reference=intent.pk)
        PaymentIntent.objects.filter(pk=intent.pk).update(hold=hold)
        intent.hold_id = hold.pk
        fresh = PaymentIntent.objects.get(pk=intent.pk)
        outbox_event_create(topic="payment_intent.authorized", payload=_intent_payload(fresh))
        return fresh

    return _intent_run(intent, body, operation="payment_intent_authorize")


def payment_intent_capture(*, intent: PaymentIntent, amount: object = None) -> PaymentIntent:
    """authorized -> captured: charge `amount` (default: all of it, at most the authorized
    amount) and release the rest of the hold. Locks: the intent row, the hold, then the
    charge's balance rows."""
    minor = None if amount is None else amount_to_minor(amount)

    def body(intent: PaymentIntent) -> PaymentIntent:
        capture = intent.amount if minor is None else minor
        if capture > intent.amount:
            raise AmountInvalid(f"amount exceeds the authorized {intent.amount}", param="amount")
        locked = _intent_cas(intent, expected=(PaymentIntentStatus.AUTHORIZED,), status=PaymentIntentStatus.CAPTURED, amount_captured=capture)
        assert locked.hold is not None
        hold_release(hold=locked.hold, status=HoldStatus.CAPTURED)
        payment = _charge(
            customer_id=locked.customer_id, terminal_id=None, merchant_id=locked.merchant_id, asset_code=locked.asset_id, amount=capture
        )
        PaymentIntent.objects.filter(pk=locked.pk).update(payment=payment)
        intent.payment_id = payment.pk
        fresh = PaymentIntent.objects.get(pk=locked.pk)
        outbox_event_create(topic="payment_intent.captured", payload=_intent_payload(fresh))
        return fresh

    return _intent_run(intent, body, operation="payment_intent_capture")


def payment_intent_cancel(*, intent: PaymentIntent) -> PaymentIntent:
    """created | authorized -> canceled, releasing any hold. Locks: the intent row, the hold,
    the customer's balance row."""

    def body(intent: PaymentIntent) -> PaymentIntent:
        locked = _intent_cas(intent, expected=(PaymentIntentStatus.CREATED, PaymentIntentStatus.AUTHORIZED), status=PaymentIntentStatus.CANCELED)
        if locked.hold is not None:
            hold_release(hold=locked.hold)
        outbox_event_create(topic="payment_intent.canceled", payload=_intent_payload(locked))
        return locked

    return _intent_run(intent, body, operation="payment_intent_cancel")


# --- Payment tokens (terminal QR scan) ---------------------------------------------------


def _token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def payment_token_create(*, customer: Customer) -> tuple[PaymentToken, str]:
    """A token for the customer's QR code, valid PAYMENT_TOKEN_TTL, good for one payment.
    Returns the row and the raw token (shown once; only its SHA-256 is stored)."""
    raw = PAYMENT_TOKEN_PREFIX + ids.random_token(PAYMENT_TOKEN_RANDOM_LENGTH)
    token = PaymentToken.objects.create(customer=customer, token_hash=_token_hash(raw), expires_at=timezone.now() + PAYMENT_TOKEN_TTL)
    return token, raw


def payment_token_consume(*, token: object) -> str:
    """Use a live, unused token: mark it used and return its customer id, in the caller's
    transaction; else NotFound(param="customer_token").

    Locks: the token row (the conditional UPDATE), so of two payments racing one token
    the second waits for the first and then finds it used.
    """
    if not isinstance(token, str) or not token.startswith(PAYMENT_TOKEN_PREFIX) or len(token) > 100:
        raise NotFound("invalid or expired payment token", param="customer_token")
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{PaymentToken._meta.db_table}" SET used_at = %s '  # noqa: S608 - our own table name, no input
            "WHERE token_hash = %s AND used_at IS NULL AND expires_at > %s RETURNING customer_id",
            [now, _token_hash(token), now],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound("invalid, used or expired payment token", param="customer_token")
    return str(row[0])


def payment_create_with_token(*, terminal: Terminal, customer_token: object, asset_code: str, amount: object) -> Payment:
    """Take a payment from the customer whose QR token the terminal scanned; the token is
    consumed in the payment's own transaction (a refused payment leaves it usable).

    Locks: the token row, then those of payment_create.
    """
    minor = amount_to_minor(amount)
    if not isinstance(asset_code, str) or not asset_code:
        raise AssetUnknown(param="asset")

    def body() -> Payment:
        customer_id = payment_token_consume(token=customer_token)
        return _charge(customer_id=customer_id, terminal_id=terminal.pk, merchant_id=None, asset_code=asset_code, amount=minor)

    return run_atomic(body, operation="payment_create")


def payment_token_resolve(*, token: object) -> Customer:
    """The customer a live token belongs to, else NotFound(param="customer_token")."""
    if not isinstance(token, str) or not token.startswith(PAYMENT_TOKEN_PREFIX) or len(token) > 100:
        raise NotFound("invalid or expired payment token", param="customer_token")
    row = (
        PaymentToken.objects.select_related("customer")
        .filter(token_hash=_token_hash(token), used_at__isnull=True, expires_at__gt=timezone.now())
        .first()
    )
    if row is None:
        raise NotFound("invalid or expired payment token", param="customer_token")
    return row.customer
