"""Card top-ups at a PSP: the saga's business steps (topup_saga.py orchestrates them), the
tenant's gateway account, inbound PSP webhooks and the settlement comparison.

The PSP is always called with the top-up's id as its idempotency key (minted at claim
time, kept across retries and takeovers): asking again can only return the first charge.
Crediting is idempotent on the locked top-up row, so the inline answer, a webhook and the
recovery task may all try, and one credit results.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from payments.errors import (
    AssetNotTopUpable,
    CardDeclined,
    PspChargeMismatch,
    PspEventInvalid,
    PspKeyWindowPassed,
    PspNotConfigured,
    PspRefused,
    PspSignatureInvalid,
    PspSignatureStale,
    PspUnavailable,
)
from payments.gateways import metrics
from payments.gateways.base import ChargeRequest, ChargeResult, GatewayError, GatewayRejected, PspEvent
from payments.gateways.base import Gateway as PspGateway
from payments.gateways.credentials import credential_seal
from payments.gateways.registry import gateway_build, gateway_webhook_secrets
from payments.gateways.signing import SignatureInvalid, SignatureStale, signature_verify
from payments.locks import gateway_account_rows_lock, psp_webhook_events_expired_lock, topup_lock
from payments.models import Gateway, GatewayAccount, PspWebhookEvent, TopUp, TopUpStatus
from payments.selectors import (
    TopUpCursor,
    gateway_account_active,
    gateway_account_get,
    topup_settlement_lines,
    topups_operator_review_count,
    topups_pending_count,
    topups_refund_due,
)
from payments.services.outbox import outbox_event_create
from payments.services.topup_budget import LoopBudget, topups_in_turn
from payments.services.topup_due import topup_due_mark, topup_recovery_due_now
from payments.services.topups import topup_credit, topup_pending_new, topup_pending_save
from wallets.errors import BusinessRefusal, CapExceeded, InvalidRequest, NotFound, WalletFrozen
from wallets.models import AssetKind, Customer
from wallets.money import amount_to_minor
from wallets.selectors import asset_get
from wallets.transactions import atomic_service, is_connection_failure

# How long a charge may be asked for again with the same key: inside every supported PSP's
# idempotency-key retention (Stripe keeps keys at least 24 h).
PSP_KEY_TRUSTED_FOR = timedelta(hours=20)

logger = logging.getLogger("tally.topups")

TOP_UPABLE_KINDS = (AssetKind.CURRENCY, AssetKind.REGIONAL)

# --- The tenant's gateway account -------------------------------------------------------


@atomic_service(operation="gateway_account_set")
def gateway_account_set(*, gateway: str, api_base: str, secret_key: str, webhook_secrets: list[str], active: bool = True) -> GatewayAccount:
    """Create or replace the tenant's account at `gateway`; `active` makes it the one card
    top-ups use. Credentials are sealed before they reach the database.
    Locks: the gateway account rows."""
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


# --- Saga steps ----------------------------------------------------------------------------


def topup_pending_ensure(
    *, topup_id: str, customer: Customer, asset_code: str, amount: object, payment_method: str, claim_principal_id: str, claim_key: str
) -> TopUp:
    """Step 1, in the claim's transaction: the pending top-up and its `topup.created` outbox
    row, and its tenant's recovery due-work row, under the id minted at claim time; a takeover finds it written and returns it.
    Refuses (nothing written) a non-currency asset, a bad amount, a tenant without an
    active gateway. Locks: none (the claim row is the caller's) but the due-work lock, shared
    (`topup_due_mark`: top-up recovery is due in this tenant)."""
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
    """Step 2, outside any transaction: charge the card with the top-up id as the PSP's
    idempotency key. Raises PspUnavailable when the outcome is unknown; PspKeyWindowPassed
    when the top-up is too old to ask again (it is held for an operator); PspRefused when
    the PSP refused the request's parameters (nothing charged)."""
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
    """Whether a PSP charge is this top-up's: its amount and currency. Only a matching
    successful charge is ever credited; on a failed top-up any charge is recorded with the
    PSP's figures and refunded (`topup_settle`)."""
    return result.amount == topup.amount and result.currency.upper() == topup.asset_id.upper()


def topup_charge_mismatch_hold(*, topup_id: str, result: ChargeResult, source: str) -> bool:
    """A successful PSP charge whose amount or currency is not the top-up's: never credited.
    A pending top-up goes to the operator queue with the PSP's figures as evidence; one
    already settled is left as it is (a failed one with no charge recorded is not brought
    here: `topup_settle` records its charge for the refund). Returns whether the top-up
    entered the queue now. Locks: the top-up row."""
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
    apply the PSP's answer. Succeeded: credit amount + bonus; a credit refused now (cap,
    frozen) fails the top-up with that code, and the recovery refunds the card, as it does
    a charge that arrives after the top-up failed. Declined: the top-up fails with the
    PSP's code. Already settled: unchanged. A charge owed back marks the recovery due now.
    A successful charge is recorded only with the top-up's amount and currency (the one it
    gives back if never credited): another raises PspChargeMismatch, nothing written. On a
    top-up failed before its charge was known, any successful charge is recorded with the
    PSP's own amount and currency, and the refund gives back exactly that.
    Locks: the top-up row, then the balance rows (ledger_post); the tenant's top-up
    due-work lock, SHARED, when a charge is owed back."""
    topup = topup_lock(topup_id=topup_id)
    if topup is None:
        raise NotFound("no such top-up", param="topup")
    if topup.status == TopUpStatus.PENDING and result.status == "succeeded" and not topup_charge_matches(topup=topup, result=result):
        # One of another amount or currency is never this top-up's money to credit. The
        # callers hold it for an operator first (topup_charge_mismatch_hold); this is the
        # last defence.
        logger.error("psp charge does not match the top-up", extra={"topup": topup.pk, "psp_reference": result.psp_reference})
        raise PspChargeMismatch("the card processor's charge does not match this top-up: an operator settles it")
    if topup.status == TopUpStatus.FAILED and not topup.psp_reference and result.status == "succeeded":
        # Refused before we knew an earlier attempt's charge had gone through: record the
        # charge, so the refund task gives the card its money back (a charged, uncredited
        # top-up). A failed top-up is never credited, so whatever the PSP charged under its
        # id, matching or not, is recorded with the PSP's own amount and currency and given
        # back exactly (the reference is unique: another top-up's charge is refused below).
        if not topup_charge_matches(topup=topup, result=result):
            logger.error(
                "a failed top-up was charged another amount: refunding what the PSP charged",
                extra={"topup": topup.pk, "psp_reference": result.psp_reference, "psp_amount": result.amount, "psp_currency": result.currency},
            )
        logger.warning("a refused top-up was charged by an earlier attempt: refunding", extra={"topup": topup.pk})
        if TopUp.objects.filter(psp_reference=result.psp_reference[:200]).exclude(pk=topup.pk).exists():
            raise PspChargeMismatch("the card processor's charge is recorded on another top-up: an operator settles it")
        _charge_record(topup, result)
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


def _charge_record(topup: TopUp, result: ChargeResult) -> None:
    """The PSP's answer on the locked top-up: its reference, and for a successful charge
    what it charged (the refund's amount, if it is never credited)."""
    topup.psp_reference, topup.psp_charged_at = result.psp_reference[:200], result.created
    topup.psp_charged = result.status == "succeeded"
    if topup.psp_charged:
        topup.psp_charged_amount, topup.psp_charged_currency = result.amount, result.currency.upper()[:_CURRENCY_MAX]
    topup.save(update_fields=["psp_reference", "psp_charged_at", "psp_charged", "psp_charged_amount", "psp_charged_currency", "updated"])


def topup_fail_refunding(*, topup: TopUp, result: ChargeResult, failure_code: str) -> TopUp:
    """Fail a pending top-up whose successful PSP charge is not to be credited (an operator's
    decision: another amount or currency): the charge is recorded with the PSP's own amount
    and currency, and the recovery refunds exactly that. Raises PspChargeMismatch, nothing
    written, if the charge is recorded on another top-up. Needs: the top-up row locked
    (`topup_lock`) in the caller's transaction. Locks: then the tenant's top-up due-work
    lock, SHARED."""
    if topup.status != TopUpStatus.PENDING or result.status != "succeeded":
        raise InvalidRequest("only a pending top-up's successful charge is failed and refunded", param=None)
    if TopUp.objects.filter(psp_reference=result.psp_reference[:200]).exclude(pk=topup.pk).exists():
        raise PspChargeMismatch("the card processor's charge is recorded on another top-up: an operator settles it")
    _charge_record(topup, result)
    return topup_fail(topup=topup, failure_code=failure_code)


def topup_refuse(*, topup_id: str, refusal: BusinessRefusal) -> tuple[TopUp, BusinessRefusal | None]:
    """Refused without a charge: before the card was charged (frozen, cap), or by the PSP
    itself (PspRefused). The top-up fails with the refusal's code. Locks: the top-up row."""
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
    """Fail a pending top-up and write its `topup.failed` event; one the PSP charged is
    marked for the recovery, which refunds the card. Needs: the top-up row locked
    (`topup_lock`) in the caller's transaction. Locks: then the tenant's top-up due-work
    lock, SHARED, if charged."""
    topup.status, topup.failure_code = TopUpStatus.FAILED, failure_code[:50]
    topup.save(update_fields=["status", "failure_code", "updated"])
    if topup.psp_charged:
        topup_recovery_due_now()
    outbox_event_create(topic="topup.failed", payload={"id": topup.id, "object": "topup", "failure_code": topup.failure_code})
    return topup


def topup_refunds_run(*, batch_size: int = 100, budget: LoopBudget | None = None) -> dict[str, int]:
    """Refund the card of every charged top-up that ended without a credit (key
    `<top-up id>:refund`), page by page, from where the last run cut short by its budget
    stopped (topup_budget.topups_in_turn). One that fails is logged, counted and tried
    again next run; the others go on. With `budget`, stops taking refunds once it is
    spent (`budget.exhausted`: refunds are left for the next run). Returns counts by
    outcome. Locks: each top-up row, briefly, to record the refund."""
    counts = {"refunded": 0, "refund_unavailable": 0, "refund_errors": 0}
    names = {"refunded": "refunded", "unavailable": "refund_unavailable", "error": "refund_errors"}

    def fetch(after: TopUpCursor | None, before: TopUpCursor | None, limit: int) -> list[TopUp]:
        return topups_refund_due(after=after, before=before, limit=limit)

    owed = topups_in_turn(loop="refunds", fetch=fetch, batch_size=batch_size, budget=budget or LoopBudget(seconds=float("inf")))
    for topup in owed:
        outcome = recovery_step_isolated(step="refund", topup_id=topup.pk, fn=functools.partial(_refund_one, topup))
        counts[names[outcome]] += 1
        metrics.TOPUP_CARD_REFUNDS.labels(outcome=outcome).inc()
    return counts


def _refund_one(topup: TopUp) -> str:
    try:
        gateway = gateway_build(account=gateway_account_get(gateway=topup.gateway))
        # What the PSP charged, not what we asked for. Rows recorded before it was kept have
        # none (and an older branch recorded charges without checking the amount): the PSP
        # is asked what the charge was.
        amount = topup.psp_charged_amount if topup.psp_charged_amount is not None else _charged_amount_at_psp(gateway, topup)
        if amount is None:
            topup_last_error_note(topup_id=topup.pk, error=f"card refund: the PSP does not list the charge {topup.psp_reference}")
            return "unavailable"
        refund = gateway.refund(psp_reference=topup.psp_reference, amount=amount, idempotency_key=f"{topup.pk}:refund")
    except (GatewayError, NotFound) as exc:
        logger.warning("card refund of an uncredited top-up failed; retried next run", extra={"topup": topup.pk, "error": str(exc)})
        topup_last_error_note(topup_id=topup.pk, error=f"card refund: {exc}")
        return "unavailable"
    _refund_record(topup_id=topup.pk, reference=refund.psp_reference)
    return "refunded"


def _charged_amount_at_psp(gateway: PspGateway, topup: TopUp) -> int | None:
    """The amount of the recorded charge as the PSP holds it (its search by the top-up id),
    or None when it does not list that charge as successful. Raises GatewayError."""
    for charge in gateway.charges_of(reference=topup.pk):
        if charge.psp_reference == topup.psp_reference and charge.status == "succeeded":
            return charge.amount
    return None


@atomic_service(operation="topup_refund_record")
def _refund_record(*, topup_id: str, reference: str) -> None:
    topup = topup_lock(topup_id=topup_id)
    if topup is not None and not topup.psp_refund_reference:
        topup.psp_refund_reference = reference[:200]
        topup.save(update_fields=["psp_refund_reference", "updated"])
        outbox_event_create(topic="topup.card_refunded", payload={"id": topup.id, "object": "topup", "psp_refund": reference})


def recovery_step_isolated(*, step: str, topup_id: str, fn: Callable[[], str]) -> str:
    """`fn()`'s outcome, or "error" if it raises: logged and kept as the top-up's last
    error, so one bad record never stops a recovery run. A lost database connection is no
    single record's fault: it propagates; so does Celery's soft time limit, which ends the
    pass (SoftTimeLimitExceeded is an Exception: named first, so it is never swallowed)."""
    try:
        return fn()
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:
        if isinstance(exc, DatabaseError) and is_connection_failure(exc):
            raise
        logger.exception("top-up recovery failed on one record; the run goes on", extra={"topup": topup_id, "step": step})
        try:
            topup_last_error_note(topup_id=topup_id, error=f"{step}: {type(exc).__name__}: {exc}")
        except DatabaseError:
            logger.warning("could not note the error on the top-up", extra={"topup": topup_id})
        return "error"


def topup_last_error_note(*, topup_id: str, error: str) -> None:
    """Keep what the last attempt to settle or refund a top-up ran into, for the operator.
    `updated` is left alone: the reconciliation ages an unrefunded charge by it.
    Locks: the top-up row, for its one UPDATE."""
    TopUp.objects.filter(pk=topup_id).exclude(last_error=error[:500]).update(last_error=error[:500])


@atomic_service(operation="topup_review_hold")
def topup_review_hold(*, topup_id: str, reason: str) -> bool:
    """Put a pending top-up in the operator queue, saying why in its last error; the
    recovery no longer asks the PSP about it. Returns whether it entered the queue now.
    Locks: the top-up row."""
    topup = topup_lock(topup_id=topup_id)
    if topup is None or topup.status != TopUpStatus.PENDING or topup.operator_review_at is not None:
        return False
    topup.operator_review_at = timezone.now()
    topup.last_error = (f"{reason} (before: {topup.last_error})" if topup.last_error else reason)[:500]
    topup.save(update_fields=["operator_review_at", "last_error", "updated"])
    logger.error("card top-up waits for an operator", extra={"topup": topup.pk, "reason": reason})
    return True


def topups_gauges_refresh() -> dict[str, int]:
    """The pending and operator-queue gauges of the current tenant."""
    tenant = str(getattr(connection, "schema_name", "public"))
    pending, review = topups_pending_count(), topups_operator_review_count()
    metrics.TOPUPS_PENDING.labels(tenant=tenant).set(pending)
    metrics.TOPUPS_OPERATOR_REVIEW.labels(tenant=tenant).set(review)
    return {"pending": pending, "operator_review": review}


# --- Inbound PSP webhooks ------------------------------------------------------------------


def psp_webhook_receive(*, gateway_name: str, signature: str | None, body: bytes, now: float | None = None) -> str:
    """Verify and apply one inbound PSP event; returns the outcome (applied, duplicate,
    ignored, wrong_gateway, mismatch). The signature first (PspSignatureInvalid /
    PspSignatureStale, nothing applied); then the event id is recorded in the same
    transaction as its effect, so a redelivery is a duplicate and a failing effect leaves
    the retry to be processed.

    An event speaks only for the gateway whose secret signed it: about a top-up of another
    gateway (`wrong_gateway`) it changes nothing. A successful charge whose amount or
    currency is not the top-up's (`mismatch`) credits nothing and puts a pending top-up in
    the operator queue; on a top-up failed with no charge recorded it is recorded with the
    PSP's amount and currency and refunded (`applied`). Both are recorded and logged, and acknowledged (2xx): the event is
    authentic, and a provider retries a 4xx for days (Stripe: 3) with nothing to gain, so
    a person looks instead. Locks: see `_event_apply`."""
    try:
        account = gateway_account_get(gateway=gateway_name)
    except NotFound:
        metrics.PSP_WEBHOOKS.labels(gateway="unknown", outcome="refused_signature").inc()
        raise
    gateway = gateway_build(account=account)
    try:
        signature_verify(header=signature, body=body, secrets=gateway_webhook_secrets(account=account), now=now or time.time())
    except SignatureStale as exc:
        metrics.PSP_WEBHOOKS.labels(gateway=gateway_name, outcome="refused_stale").inc()
        raise PspSignatureStale("the signature's timestamp is outside the 300 s tolerance", param=None) from exc
    except SignatureInvalid as exc:
        metrics.PSP_WEBHOOKS.labels(gateway=gateway_name, outcome="refused_signature").inc()
        raise PspSignatureInvalid("the webhook signature is missing or matches no secret", param=None) from exc
    try:
        event = gateway.event_parse(body)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        metrics.PSP_WEBHOOKS.labels(gateway=gateway_name, outcome="failed").inc()
        raise PspEventInvalid("the event body is not a valid event", param=None) from exc
    try:
        outcome = _event_apply(gateway_name=gateway_name, event=event)
    except Exception:
        metrics.PSP_WEBHOOKS.labels(gateway=gateway_name, outcome="failed").inc()
        raise
    metrics.PSP_WEBHOOKS.labels(gateway=gateway_name, outcome=outcome).inc()
    if outcome == "ignored":
        logger.info("psp webhook acknowledged without effect", extra={"gateway": gateway_name, "event": event.id, "type": event.type})
    elif outcome == "wrong_gateway":
        logger.error(
            "psp webhook about a top-up of another gateway: acknowledged, not applied",
            extra={"gateway": gateway_name, "event": event.id, "type": event.type, "topup": event.reference},
        )
    return outcome


@atomic_service(operation="psp_webhook_apply")
def _event_apply(*, gateway_name: str, event: PspEvent) -> str:
    """The event marker (unique per gateway and event id: a concurrent duplicate waits on
    it), then the effect, in one transaction or savepoint. Locks: the marker's unique
    index entry, then the top-up row and balance rows (topup_settle), or the top-up row
    alone (topup_charge_mismatch_hold)."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                marker = PspWebhookEvent.objects.create(
                    gateway=gateway_name, event_id=event.id[:255], type=event.type[:100], outcome="applied"
                )
        except IntegrityError:
            return "duplicate"
        outcome = "ignored"
        about = (
            TopUp.objects.filter(pk=event.reference).first()
            if event.kind in ("charge_succeeded", "charge_failed") and event.reference else None
        )
        if about is not None:
            result = ChargeResult(
                status="succeeded" if event.kind == "charge_succeeded" else "failed", psp_reference=event.psp_reference,
                amount=event.amount, currency=event.currency, failure_code=event.failure_code, created=event.created,
            )
            if about.gateway != gateway_name:
                # Another gateway's secret (the simulator's sits in var/) must never settle
                # a Stripe top-up, nor the reverse.
                outcome = "wrong_gateway"
            elif (
                result.status == "succeeded" and not topup_charge_matches(topup=about, result=result)
                and not (about.status == TopUpStatus.FAILED and not about.psp_reference)
            ):
                # A pending top-up: never credited, held for an operator. A failed one with no
                # charge recorded falls through: topup_settle records the PSP's charge, refunded.
                topup_charge_mismatch_hold(topup_id=about.pk, result=result, source=f"webhook {event.id}")
                outcome = "mismatch"
            else:
                try:
                    topup_settle(topup_id=event.reference, result=result)
                    outcome = "applied"
                except PspChargeMismatch:  # the charge is recorded on another top-up: a person looks
                    outcome = "mismatch"
        marker.outcome = outcome
        marker.save(update_fields=["outcome"])
        return outcome


# Providers retry an event for days (Stripe: up to 3); an older marker meets no duplicate.
PSP_WEBHOOK_EVENT_RETENTION_DAYS = 30


# Batches one purge deletes at most: a backlog (a retention shortened, purges missed) is
# worked off over passes, never in one that outlasts the task's time limit.
PSP_WEBHOOK_PURGE_MAX_BATCHES = 20


def psp_webhook_events_purge(
    *, older_than_days: int = PSP_WEBHOOK_EVENT_RETENTION_DAYS, batch_size: int = 1000, max_batches: int = PSP_WEBHOOK_PURGE_MAX_BATCHES
) -> int:
    """Delete inbound event markers past retention, one short transaction a batch, at most
    `max_batches` batches (the rest is the next run's). Locks: each batch's rows (SKIP LOCKED)."""
    horizon = timezone.now() - timedelta(days=older_than_days)
    total = 0
    for _ in range(max_batches):
        with transaction.atomic():
            ids = psp_webhook_events_expired_lock(received_before=horizon, limit=batch_size)
            deleted = PspWebhookEvent.objects.filter(pk__in=ids).delete()[0] if ids else 0
        total += deleted
        if deleted < batch_size:
            break
    return total


# --- Settlement ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SettlementComparison:
    day: date
    gateway: str
    matched: int
    ours_total: int
    psp_total: int
    missing_at_psp: list[str] = field(default_factory=list)  # our top-up ids the PSP did not settle
    missing_here: list[str] = field(default_factory=list)  # PSP charge ids with no top-up of ours
    amount_mismatches: list[str] = field(default_factory=list)  # top-up ids whose amounts differ

    @property
    def balanced(self) -> bool:
        return not (self.missing_at_psp or self.missing_here or self.amount_mismatches)


def topup_settlement_compare(*, day: date, gateway: str | None = None) -> SettlementComparison:
    """Our top-ups charged on `day` against the PSP's settlement report for that day,
    matched on the PSP reference. Reads only."""
    account = gateway_account_get(gateway=gateway) if gateway else gateway_account_active()
    if account is None:
        raise PspNotConfigured("no active card gateway")
    report = gateway_build(account=account).settlement_report(day=day)
    ours = {line.psp_reference: line for line in topup_settlement_lines(day=day, gateway=account.gateway)}
    psp_charges = {line.psp_reference: line for line in report.lines if line.kind == "charge"}
    missing_at_psp = sorted(line.topup_id for ref, line in ours.items() if ref not in psp_charges)
    missing_here = sorted(ref for ref in psp_charges if ref not in ours)
    mismatches = sorted(line.topup_id for ref, line in ours.items() if ref in psp_charges and psp_charges[ref].amount != line.amount)
    return SettlementComparison(
        day=day, gateway=account.gateway, matched=len(set(ours) & set(psp_charges)),
        ours_total=sum(line.amount for line in ours.values()), psp_total=sum(line.amount for line in psp_charges.values()),
        missing_at_psp=missing_at_psp, missing_here=missing_here, amount_mismatches=mismatches,
    )
