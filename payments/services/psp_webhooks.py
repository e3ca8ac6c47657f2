"""Inbound PSP webhooks: verified, applied once, and their markers purged past retention."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from payments.errors import PspChargeMismatch, PspEventInvalid, PspSignatureInvalid, PspSignatureStale
from payments.gateways import metrics
from payments.gateways.base import ChargeResult, PayoutResult, PspEvent
from payments.gateways.registry import gateway_build, gateway_webhook_secrets
from payments.gateways.signing import SignatureInvalid, SignatureStale, signature_verify
from payments.locks import psp_webhook_events_expired_lock
from payments.models import Payout, PspWebhookEvent, TopUp, TopUpStatus
from payments.selectors import gateway_account_get
from payments.services.payout_saga import payout_return_on_commit, payout_settle
from payments.services.topups import topup_charge_matches, topup_charge_mismatch_hold, topup_settle
from wallets.errors import NotFound
from wallets.transactions import atomic_service

logger = logging.getLogger("tally.topups")


def psp_webhook_receive(*, gateway_name: str, signature: str | None, body: bytes, now: float | None = None) -> str:
    """Verify (PspSignatureInvalid / PspSignatureStale) and apply one inbound PSP event;
    returns the outcome (applied, duplicate, ignored, wrong_gateway, mismatch). An event
    speaks only for the gateway whose secret signed it, and a charge that is not a pending
    top-up's amount and currency credits nothing (`mismatch`: the operator queue), nor does
    a payout event of another amount, currency or PSP payout than ours move a payout's money
    (the payout stops in the operator queue). Both are
    acknowledged (2xx): the event is authentic, and a provider retries a 4xx for days with
    nothing to gain, so a person looks instead. Locks: see `_event_apply`."""
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
    """The event marker (unique per gateway and event id: a redelivery is a duplicate), then
    the effect, in one transaction or savepoint: a failing effect records nothing. Locks: the
    marker's unique index entry, then the top-up row and balance rows (topup_settle), or the
    top-up row alone (topup_charge_mismatch_hold), or the payout row and balance rows (payout_settle;
    a payout failed after the PSP had it is given back after the commit, `payout_return`)."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                marker = PspWebhookEvent.objects.create(
                    gateway=gateway_name, event_id=event.id[:255], type=event.type[:100], outcome="applied"
                )
        except IntegrityError:
            return "duplicate"
        if event.kind in ("payout_paid", "payout_failed"):
            outcome = _payout_event_apply(gateway_name=gateway_name, event=event)
            marker.outcome = outcome
            marker.save(update_fields=["outcome"])
            return outcome
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


def _payout_event_apply(*, gateway_name: str, event: PspEvent) -> str:
    payout = Payout.objects.filter(pk=event.reference).first() if event.reference else None
    if payout is None:
        return "ignored"
    if payout.gateway != gateway_name:
        return "wrong_gateway"
    result = PayoutResult(
        status="paid" if event.kind == "payout_paid" else "failed", psp_reference=event.psp_reference, amount=event.amount,
        currency=event.currency, failure_code=event.failure_code, created=event.created,
    )
    outcome = payout_settle(payout_id=payout.pk, result=result, source=f"webhook {event.id}")
    if outcome == "returning":
        payout_return_on_commit(payout_id=payout.pk)  # the PSP asked for its money back outside this transaction
    return {"review": "mismatch", "in_review": "ignored"}.get(outcome, "applied")


# Providers retry an event for days (Stripe: up to 3); an older marker meets no duplicate.
PSP_WEBHOOK_EVENT_RETENTION_DAYS = 30
# A backlog is worked off over passes, never in one that outlasts the task's time limit.
PSP_WEBHOOK_PURGE_MAX_BATCHES = 20


def psp_webhook_events_purge(
    *, older_than_days: int = PSP_WEBHOOK_EVENT_RETENTION_DAYS, batch_size: int = 1000, max_batches: int = PSP_WEBHOOK_PURGE_MAX_BATCHES
) -> int:
    """Delete inbound event markers past retention, one short transaction a batch, at most
    `max_batches`. Locks: each batch's rows (SKIP LOCKED)."""
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
