"""Top-ups: money entering a wallet from PSP funding, plus the tenant's top-up bonus
(`topup_bonus_rate`, ROUND_FLOOR) from the bonus pool; the card top-up's steps (which
topup_saga.py orchestrates) and the gateway account they charge through. The PSP is always
asked with the top-up's id as its idempotency key, so asking again returns the first
charge; crediting is idempotent on the locked top-up row, so the inline answer, a webhook
and the recovery may all try, and one credit results."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from payments.errors import AssetNotTopUpable, CardDeclined, PspChargeMismatch, PspKeyWindowPassed, PspNotConfigured, PspRefused, PspUnavailable
from payments.gateways.base import ChargeRequest, ChargeResult, GatewayError, GatewayRejected
from payments.gateways.credentials import credential_seal
from payments.gateways.registry import gateway_build
from payments.locks import gateway_account_rows_lock, topup_lock
from payments.models import Gateway, GatewayAccount, TopUp, TopUpStatus
from payments.selectors import gateway_account_active, gateway_account_get
from payments.services.outbox import outbox_event_create
from payments.services.topup_due import topup_due_mark, topup_recovery_due_now
from tenants.selectors import tenant_current, tenant_rate
from wallets.errors import BusinessRefusal, CapExceeded, InvalidRequest, InvalidState, NotFound, WalletFrozen
from wallets.models import Asset, AssetKind, Customer, LedgerTransactionKind, SystemRole
from wallets.money import amount_to_minor, topup_bonus_for
from wallets.selectors import account_balance, account_of, asset_get, movement_accounts_get
from wallets.services.ledger import Leg, ledger_post
from wallets.transactions import atomic_service

# How long a charge may be asked for again with the same key: inside every supported PSP's
# idempotency-key retention (Stripe keeps keys at least 24 h).
PSP_KEY_TRUSTED_FOR = timedelta(hours=20)

logger = logging.getLogger("tally.topups")

TOP_UPABLE_KINDS = (AssetKind.CURRENCY, AssetKind.REGIONAL)


@atomic_service(operation="gateway_account_set")
def gateway_account_set(*, gateway: str, api_base: str, secret_key: str, webhook_secrets: list[str], active: bool = True) -> GatewayAccount:
    """Create or replace the tenant's account at `gateway` (credentials sealed); `active`
    makes it the one card top-ups use. Locks: the gateway account rows."""
    if gateway not in Gateway.values:
        raise InvalidRequest("gateway must be simulator or stripe", param="gateway")
    if not secret_key or not webhook_secrets or not all(isinstance(s, str) and s for s in webhook_secrets):
        raise InvalidRequest("a secret key and at least one webhook secret are required", param="webhook_secrets")
    schema = str(getattr(connection, "schema_name", "public"))
    gateway_account_rows_lock()
    if active:
        GatewayAccount.objects.filter(active=True).exclude(gateway=gateway).update(active=False)
    account, _ = GatewayAccount.objects.update_or_create(
        gateway=gateway,
        defaults={
            "api_base": api_base, "active": active,
            "secret_key_sealed": credential_seal(value=secret_key, schema=schema, gateway=gateway, field="secret_key"),
            "webhook_secrets_sealed": credential_seal(value=json.dumps(webhook_secrets), schema=schema, gateway=gateway, field="webhook_secrets"),
        },
    )
    return account


def topup_pending_new(*, customer: Customer, asset: Asset, amount: int, payment_method: object, **fields: str) -> TopUp:
    """A pending top-up with the tenant's bonus, not yet saved (`fields`: its id, and the
    saga's columns)."""
    if not isinstance(payment_method, str) or not payment_method.strip():
        raise InvalidRequest("payment_method is required", param="payment_method")
    bonus = topup_bonus_for(amount=amount, rate=tenant_rate(tenant_current(), "topup_bonus_rate"))
    return TopUp(customer=customer, asset=asset, amount=amount, bonus_amount=bonus, payment_method=payment_method[:100], **fields)


def topup_pending_save(*, topup: TopUp) -> TopUp:
    """Insert a pending top-up and its `topup.created` event. Locks: none (a new row)."""
    topup.save(force_insert=True)
    outbox_event_create(topic="topup.created", payload=_event_payload(topup))
    return topup


def _event_payload(topup: TopUp, **more: object) -> dict[str, object]:
    return {
        "id": topup.id, "object": "topup", "customer": topup.customer_id, "asset": topup.asset_id, "amount": topup.amount,
        "status": topup.status, **more,
    }


def topup_refusal_check(*, topup: TopUp) -> BusinessRefusal | None:
    """The refusal the credit would make now (frozen wallet, cap on amount + bonus), read
    without a lock: the credit checks again under its locks."""
    account = account_of(party=topup.customer)
    if account.frozen:
        return WalletFrozen("the wallet is frozen", param=None)
    asset = asset_get(asset_code=topup.asset_id)
    if asset.cap is not None:
        balance, _ = account_balance(account=account, asset_code=asset.code)
        if balance + topup.amount + topup.bonus_amount > asset.cap:
            return CapExceeded(f"the wallet's {asset.code} balance would exceed its cap of {asset.cap}", param="amount")
    return None


@atomic_service(operation="topup_create")
def topup_create(*, customer: Customer, asset_code: str, amount: object, payment_method: str) -> TopUp:
    """Record a top-up as `pending`, refusing early what the credit would refuse.
    Locks: none (the credit locks and checks again)."""
    minor = amount_to_minor(amount)
    topup = topup_pending_new(customer=customer, asset=asset_get(asset_code=asset_code), amount=minor, payment_method=payment_method)
    refusal = topup_refusal_check(topup=topup)
    if refusal is not None:
        raise refusal
    return topup_pending_save(topup=topup)


@atomic_service(operation="topup_credit")
def _topup_credit(*, topup_id: str) -> TopUp:
    locked = topup_lock(topup_id=topup_id)
    if locked is None:
        raise NotFound("no such top-up", param="topup")
    if locked.status == TopUpStatus.SUCCEEDED:
        return locked
    if locked.status != TopUpStatus.PENDING:
        raise InvalidState(f"top-up is {locked.status}", param=None)
    accounts = movement_accounts_get(customer_id=locked.customer_id, merchant_id=None, system_roles=(SystemRole.PSP_FUNDING, SystemRole.BONUS_POOL))
    account = accounts.customer
    assert account is not None
    legs = [Leg(accounts.system_account(SystemRole.PSP_FUNDING), locked.asset_id, -locked.amount), Leg(account, locked.asset_id, locked.amount)]
    if locked.bonus_amount > 0:
        legs += [
            Leg(accounts.system_account(SystemRole.BONUS_POOL), locked.asset_id, -locked.bonus_amount),
            Leg(account, locked.asset_id, locked.bonus_amount),
        ]
    txn = ledger_post(kind=LedgerTransactionKind.TOPUP, reference=locked.id, legs=legs)
    locked.status = TopUpStatus.SUCCEEDED
    locked.ledger_transaction = txn
    locked.save(update_fields=["status", "ledger_transaction", "updated"])
    outbox_event_create(topic="topup.succeeded", payload=_event_payload(locked, bonus_amount=locked.bonus_amount))
    return locked


def topup_credit(*, topup: TopUp) -> TopUp:
    """Credit a pending top-up from PSP funding, plus its bonus from the bonus pool, once
    (CapExceeded on amount + bonus). Locks: the top-up row, then the balance rows."""
    result = _topup_credit(topup_id=topup.pk)
    topup.status, topup.ledger_transaction_id = result.status, result.ledger_transaction_id
    return result


def topup_pending_ensure(
    *, topup_id: str, customer: Customer, asset_code: str, amount: object, payment_method: str, claim_principal_id: str, claim_key: str
) -> TopUp:
    """Step 1, in the claim's transaction: the pending top-up under the id minted at claim
    time, its `topup.created` event and the recovery's due-work row; a takeover finds it
    written and returns it. Refuses (nothing written) a non-currency asset, a bad amount,
    a tenant without an active gateway. Locks: the due-work lock, SHARED (`topup_due_mark`)."""
    existing = TopUp.objects.filter(pk=topup_id).first()
    if existing is not None:
        topup_due_mark()  # this claim's lease is recovery work, whatever became of the top-up
        return existing
    minor = amount_to_minor(amount)
    asset = asset_get(asset_code=asset_code)
    if asset.kind not in TOP_UPABLE_KINDS:
        raise AssetNotTopUpable(f"{asset.code} is not a currency: card top-ups buy the main or a regional currency", param="asset")
    topup = topup_pending_new(customer=customer, asset=asset, amount=minor, payment_method=payment_method, id=topup_id)
    account = gateway_account_active()
    if account is None:
        raise PspNotConfigured("card top-ups are not set up for this operator")
    topup.gateway, topup.claim_principal_id, topup.claim_key = account.gateway, claim_principal_id[:64], claim_key[:255]
    topup_due_mark()
    return topup_pending_save(topup=topup)


# The PSP's name of a refused parameter, as the top-up request calls it.
_PSP_PARAMS = {"amount": "amount", "currency": "asset", "payment_method": "payment_method"}


def topup_charge(*, topup: TopUp) -> ChargeResult:
    """Step 2, outside any transaction: charge the card under the top-up's id. Raises
    PspUnavailable (outcome unknown), PspKeyWindowPassed (too old to ask again: held for an
    operator), PspRefused (the PSP refused the request's parameters: nothing charged)."""
    if timezone.now() - topup.created > PSP_KEY_TRUSTED_FOR:
        # A PSP forgets idempotency keys (Stripe after 24 h): asking again could charge twice.
        topup_review_hold(topup_id=topup.pk, reason="past the PSP's idempotency-key window with no known outcome")
        raise PspKeyWindowPassed("this top-up is past the card processor's idempotency window: an operator settles it")
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=topup.gateway))
    except NotFound as exc:
        raise PspNotConfigured("the top-up's gateway is no longer configured") from exc
    request = ChargeRequest(
        amount=topup.amount, currency=topup.asset_id, payment_method=topup.payment_method, idempotency_key=topup.pk, reference=topup.pk
    )
    try:
        return gateway.charge(request)
    except GatewayRejected as exc:
        logger.warning("psp refused a charge request: nothing charged", extra={"topup": topup.pk, "psp_code": exc.code, "param": exc.param})
        detail = f" ({exc.code})" if exc.code else ""
        raise PspRefused(
            f"the card processor refused this top-up{detail}: nothing was charged", param=_PSP_PARAMS.get(str(exc.param))
        ) from exc
    except GatewayError as exc:
        raise PspUnavailable("no answer from the card processor: retry with the same Idempotency-Key") from exc


# A top-up failed with one of these was never charged.
NOT_CHARGED_CODES = ("psp_refused", "not_charged")
# An operator failed it and had the PSP's charge (of another amount) given back.
CHARGE_REFUNDED_CODE = "charge_refunded"


def topup_charge_matches(*, topup: TopUp, result: ChargeResult) -> bool:
    """Whether a PSP charge is this top-up's (amount and currency): only such is credited."""
    return result.amount == topup.amount and result.currency.upper() == topup.asset_id.upper()


def topup_charge_mismatch_hold(*, topup_id: str, result: ChargeResult, source: str) -> bool:
    """A successful PSP charge that is not the top-up's: a pending top-up goes to the
    operator queue with the PSP's figures as evidence (settled ones are left as they are).
    Returns whether it entered the queue now. Locks: the top-up row."""
    logger.error(
        "psp charge does not match the top-up: not credited, an operator settles it",
        extra={"topup": topup_id, "psp_reference": result.psp_reference, "psp_amount": result.amount,
               "psp_currency": result.currency, "source": source},
    )
    reason = f"the PSP's charge {result.psp_reference} is {result.amount} {result.currency.upper()}, not the top-up's ({source})"
    return topup_review_hold(topup_id=topup_id, reason=reason)


def _refusal_of(topup: TopUp) -> BusinessRefusal | None:
    if topup.status != TopUpStatus.FAILED:
        return None
    if topup.failure_code == "cap_exceeded":
        return CapExceeded(f"the wallet's {topup.asset_id} balance would exceed its cap", param="amount")
    if topup.failure_code == "wallet_frozen":
        return WalletFrozen("the wallet is frozen", param=None)
    if topup.failure_code == CHARGE_REFUNDED_CODE:
        return PspRefused("the card processor's charge did not match this top-up: nothing credited, the charge is refunded", param=None)
    if topup.failure_code in NOT_CHARGED_CODES:
        return PspRefused("the card processor did not take this top-up: nothing was charged", param=None)
    return CardDeclined(f"the card was declined ({topup.failure_code})", param="payment_method")


def topup_outcome(*, topup_id: str) -> tuple[TopUp, BusinessRefusal | None]:
    """The top-up as it stands and, if it failed, the refusal that answers it."""
    topup = TopUp.objects.get(pk=topup_id)
    return topup, _refusal_of(topup)


def topup_settle(*, topup_id: str, result: ChargeResult) -> tuple[TopUp, BusinessRefusal | None]:
    """Step 3 / 4, in the caller's transaction (the fenced completion, or a webhook's):
    apply the PSP's answer. Succeeded: credit amount + bonus, or, refused now (cap, frozen),
    fail with that code for the recovery to refund the card. Declined: fail with the PSP's
    code. Already settled: unchanged. A pending top-up's charge of another amount or
    currency raises PspChargeMismatch, nothing written.
    Locks: the top-up row, then the balance rows (ledger_post); the tenant's top-up
    due-work lock, SHARED, when a charge is owed back."""
    topup = topup_lock(topup_id=topup_id)
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    if topup.status == TopUpStatus.PENDING and result.status == "succeeded" and not topup_charge_matches(topup=topup, result=result):
        # The callers hold it for an operator first (topup_charge_mismatch_hold): the last defence.
        logger.error("psp charge does not match the top-up", extra={"topup": topup.pk, "psp_reference": result.psp_reference})
        raise PspChargeMismatch("the card processor's charge does not match this top-up: an operator settles it")
    if topup.status == TopUpStatus.FAILED and not topup.psp_reference and result.status == "succeeded":
        # Refused before an earlier attempt's charge was known: whatever the PSP charged
        # under its id, matching or not, is recorded with the PSP's own figures and given
        # back exactly (`_charge_record` refuses another top-up's charge).
        if not topup_charge_matches(topup=topup, result=result):
            logger.error(
                "a failed top-up was charged another amount: refunding what the PSP charged",
                extra={"topup": topup.pk, "psp_reference": result.psp_reference, "psp_amount": result.amount, "psp_currency": result.currency},
            )
        logger.warning("a refused top-up was charged by an earlier attempt: refunding", extra={"topup": topup.pk})
        _charge_record(topup, result, to_refund=True)
        topup_recovery_due_now()
        return topup, _refusal_of(topup)
    if topup.status != TopUpStatus.PENDING:
        return topup, _refusal_of(topup)
    _charge_record(topup, result)
    if result.status == "succeeded":
        try:
            with transaction.atomic():  # a refusal is raised before ledger_post writes; the savepoint makes that certain
                credited = topup_credit(topup=topup)
            return credited, None
        except (CapExceeded, WalletFrozen) as refusal:
            code = "cap_exceeded" if isinstance(refusal, CapExceeded) else "wallet_frozen"
            return topup_fail(topup=topup, failure_code=code), refusal
    failed = topup_fail(topup=topup, failure_code=result.failure_code or "card_declined")
    return failed, _refusal_of(failed)


_CURRENCY_MAX = TopUp._meta.get_field("psp_charged_currency").max_length or 12


def _charge_record(topup: TopUp, result: ChargeResult, *, to_refund: bool = False) -> None:
    """The PSP's answer on the locked top-up: its reference and, charged, what it charged
    (what a refund gives back). A charge `to_refund` recorded on another top-up raises
    PspChargeMismatch, nothing written: one charge belongs to one top-up."""
    if to_refund and TopUp.objects.filter(psp_reference=result.psp_reference[:200]).exclude(pk=topup.pk).exists():
        raise PspChargeMismatch("the card processor's charge is recorded on another top-up: an operator settles it")
    topup.psp_reference, topup.psp_charged_at = result.psp_reference[:200], result.created
    topup.psp_charged = result.status == "succeeded"
    if topup.psp_charged:
        topup.psp_charged_amount, topup.psp_charged_currency = result.amount, result.currency.upper()[:_CURRENCY_MAX]
    topup.save(update_fields=["psp_reference", "psp_charged_at", "psp_charged", "psp_charged_amount", "psp_charged_currency", "updated"])


def topup_fail_refunding(*, topup: TopUp, result: ChargeResult, failure_code: str) -> TopUp:
    """Fail a pending top-up whose successful PSP charge an operator will not credit: the
    charge is recorded with the PSP's figures for the recovery to refund (as `_charge_record`).
    Needs: the top-up row locked. Locks: then the tenant's top-up due-work lock, SHARED."""
    if topup.status != TopUpStatus.PENDING or result.status != "succeeded":
        raise InvalidRequest("only a pending top-up's successful charge is failed and refunded", param=None)
    _charge_record(topup, result, to_refund=True)
    return topup_fail(topup=topup, failure_code=failure_code)


def topup_refuse(*, topup_id: str, refusal: BusinessRefusal) -> tuple[TopUp, BusinessRefusal | None]:
    """Fail the top-up with the code of a refusal made without a charge (frozen, cap, or
    PspRefused). Locks: the top-up row."""
    topup = topup_lock(topup_id=topup_id)
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    if topup.status != TopUpStatus.PENDING:  # settled meanwhile (a webhook): answer what it holds
        return topup, _refusal_of(topup)
    if isinstance(refusal, PspRefused):
        topup.last_error = refusal.message[:500]
        topup.save(update_fields=["last_error", "updated"])
    topup_fail(topup=topup, failure_code=str(refusal.code))
    return topup, refusal


def topup_abandon(*, topup_id: str) -> None:
    """The claim was released without a stored answer: a pending, never-charged top-up of
    it fails as `request_invalid`. Locks: the top-up row."""
    topup = topup_lock(topup_id=topup_id)
    if topup is not None and topup.status == TopUpStatus.PENDING and not topup.psp_reference:
        topup_fail(topup=topup, failure_code="request_invalid")


def topup_fail(*, topup: TopUp, failure_code: str) -> TopUp:
    """Fail a pending top-up (`topup.failed`); one the PSP charged is due for the recovery's
    card refund. Needs: the top-up row locked. Locks: then the due-work lock, SHARED, if charged."""
    topup.status, topup.failure_code = TopUpStatus.FAILED, failure_code[:50]
    topup.save(update_fields=["status", "failure_code", "updated"])
    if topup.psp_charged:
        topup_recovery_due_now()
    outbox_event_create(topic="topup.failed", payload={"id": topup.id, "object": "topup", "failure_code": topup.failure_code})
    return topup


def topup_last_error_note(*, topup_id: str, error: str) -> None:
    """Keep what the last attempt to settle or refund a top-up ran into, for the operator
    (not `updated`: the reconciliation ages an unrefunded charge by it). Locks: the top-up row."""
    TopUp.objects.filter(pk=topup_id).exclude(last_error=error[:500]).update(last_error=error[:500])


@atomic_service(operation="topup_review_hold")
def topup_review_hold(*, topup_id: str, reason: str) -> bool:
    """Put a pending top-up in the operator queue (the recovery no longer asks the PSP), saying
    why in its last error. Returns whether it entered the queue now. Locks: the top-up row."""
    topup = topup_lock(topup_id=topup_id)
    if topup is None or topup.status != TopUpStatus.PENDING or topup.operator_review_at is not None:
        return False
    topup.operator_review_at = timezone.now()
    topup.last_error = (f"{reason} (before: {topup.last_error})" if topup.last_error else reason)[:500]
    topup.save(update_fields=["operator_review_at", "last_error", "updated"])
    logger.error("card top-up waits for an operator", extra={"topup": topup.pk, "reason": reason})
    return True
