"""The Stripe adapter (production): PaymentIntents confirmed at once with the card's
PaymentMethod, our top-up id as Stripe's Idempotency-Key and in `metadata.tally_topup`.
A decline is Stripe's 402 CardError. No answer, a 5xx or 429, our key refused (401, 403)
or Stripe's idempotency layer objecting: GatewayUnavailable, none of which says anything
about an earlier attempt's charge (stripe-python's own retries are off: the saga retries
with the same key). Other 4xx (`amount_too_small`, an unknown currency): GatewayRejected;
Stripe saves no idempotent result for a request that failed validation. Webhooks are
signed as in payments.gateways.signing; settlement reads the day's balance transactions.

Payouts go through Connect: each merchant is a connected account holding its bank account
(our bank-account reference is `acct_.../ba_...`), created with a manual payout schedule so
that Stripe never pays out on its own what reaches it. A payout is a Transfer from the
platform to that account (`transfer_group` and `metadata.tally_payout`: our payout id; key
`<payout id>:transfer`), then a Payout on it to the bank account under our payout id as its
Idempotency-Key. A payout Stripe refuses at once has its transfer reversed (key
`<payout id>:reversal:<transfer id>`) before it is failed; a reversal refused then is
GatewayReturnRefused (the payout stops for an operator, nothing given back). One that fails
or is canceled later (`payout.failed`, `payout.canceled`) leaves the money on the connected
account until the saga reverses the transfer (`payout_return`, the same key) and only then
gives it back to the merchant; no transfer at all is nothing to take back. Attaching a bank
account sets the connected account to pay out manually, a new one or one already there.
Settlement nets reversed transfers out; the connected account's balance is read for
reconciliation (`destination_balance`).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

import stripe

from payments.gateways import metrics
from payments.gateways.base import (
    BankAccountResult,
    ChargeRequest,
    ChargeResult,
    GatewayRejected,
    GatewayReturnRefused,
    GatewayUnavailable,
    PayoutRequest,
    PayoutResult,
    PspEvent,
    RefundResult,
    SettlementLine,
    SettlementReport,
    time_limit_reraise,
)

STRIPE_API_BASE = "https://api.stripe.com"
_EVENT_KINDS = {
    "payment_intent.succeeded": "charge_succeeded", "payment_intent.payment_failed": "charge_failed",
    "payout.paid": "payout_paid", "payout.failed": "payout_failed", "payout.canceled": "payout_failed",
}


class StripeGateway:
    name = "stripe"

    def __init__(self, *, api_base: str, secret_key: str, timeout: float) -> None:
        self.client = stripe.StripeClient(
            secret_key,
            base_addresses={"api": (api_base or STRIPE_API_BASE).rstrip("/")},
            http_client=stripe.RequestsClient(timeout=timeout),
            max_network_retries=0,
        )

    def _call(self, operation: str, fn: Any) -> Any:
        started = time.monotonic()
        try:
            try:
                return fn()
            except stripe.StripeError as exc:
                time_limit_reraise(exc)  # the task's time is up, not Stripe's answer
                raise
        except stripe.CardError:
            raise
        except (stripe.APIConnectionError, stripe.RateLimitError) as exc:
            metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="unavailable").inc()
            raise GatewayUnavailable(f"{operation}: no answer from Stripe") from exc
        except (stripe.AuthenticationError, stripe.PermissionError, stripe.IdempotencyError) as exc:
            metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="unavailable").inc()
            raise GatewayUnavailable(f"{operation}: Stripe answered {exc.http_status} ({type(exc).__name__})") from exc
        except stripe.StripeError as exc:
            status = int(getattr(exc, "http_status", None) or 0)
            if status == 0 or status >= 500 or status == 409:
                metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="unavailable").inc()
                raise GatewayUnavailable(f"{operation}: Stripe answered {status or 'nothing'}") from exc
            metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="rejected").inc()
            code = getattr(exc, "code", None)
            raise GatewayRejected(
                f"{operation}: Stripe refused the request ({status} {code or 'invalid_request'})", param=getattr(exc, "param", None), code=code
            ) from exc
        finally:
            metrics.PSP_CALL_SECONDS.labels(gateway=self.name, operation=operation).observe(time.monotonic() - started)

    def charge(self, request: ChargeRequest) -> ChargeResult:
        params: Any = {
            "amount": request.amount, "currency": request.currency.lower(), "payment_method": request.payment_method,
            "confirm": True, "metadata": {"tally_topup": request.reference},
            "automatic_payment_methods": {"enabled": True, "allow_redirects": "never"},
        }
        try:
            options: Any = {"idempotency_key": request.idempotency_key}
            intent = self._call("charge", lambda: self.client.v1.payment_intents.create(params=params, options=options))
        except GatewayRejected as exc:
            if exc.param != "payment_method":
                raise
            return ChargeResult(status="failed", psp_reference="", amount=request.amount, currency=request.currency.upper(),
                                failure_code="payment_method_invalid")
        except stripe.CardError as exc:
            error = exc.error
            failed_intent = getattr(error, "payment_intent", None) if error is not None else None
            return ChargeResult(
                status="failed", psp_reference=str(getattr(failed_intent, "id", "") or ""), amount=request.amount,
                currency=request.currency.upper(), failure_code=str(getattr(error, "decline_code", None) or exc.code or "card_declined"),
                created=_ts(getattr(failed_intent, "created", None)),
            )
        status = str(intent.status)
        if status == "succeeded":
            return _result_of(intent)
        if status in ("requires_payment_method", "canceled"):
            last_error = getattr(intent, "last_payment_error", None)
            return _result_of(intent, failure_code=str(getattr(last_error, "decline_code", None) or "card_declined"))
        # processing / requires_action: not settled yet; the webhook or the recovery decides.
        raise GatewayUnavailable(f"charge: PaymentIntent {intent.id} is {status}")

    def refund(self, *, psp_reference: str, amount: int, idempotency_key: str) -> RefundResult:
        params: Any = {"payment_intent": psp_reference, "amount": amount}
        options: Any = {"idempotency_key": idempotency_key}
        refund = self._call("refund", lambda: self.client.v1.refunds.create(params=params, options=options))
        return RefundResult(psp_reference=str(refund.id), amount=int(refund.amount))

    def charges_of(self, *, reference: str) -> list[ChargeResult]:
        # Search, not a list by key: Stripe forgets idempotency keys after 24 h, the metadata stays.
        params: Any = {"query": f"metadata['tally_topup']:'{reference}'", "limit": 10}
        found = self._call("charges_of", lambda: self.client.v1.payment_intents.search(params=params))
        unsettled = [str(intent.id) for intent in found.data if str(intent.status) not in ("succeeded", "requires_payment_method", "canceled")]
        if unsettled:  # processing or awaiting action: its outcome is not known yet
            raise GatewayUnavailable(f"charges_of: PaymentIntent {unsettled[0]} is not settled yet")
        return [_result_of(intent) for intent in found.data]

    def settlement_report(self, *, day: date) -> SettlementReport:
        start = int(datetime.combine(day, datetime.min.time(), tzinfo=UTC).timestamp())
        end = int((datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(days=1)).timestamp())
        params: Any = {"created": {"gte": start, "lt": end}, "limit": 100, "expand": ["data.source"]}
        page = self._call("settlement", lambda: self.client.v1.balance_transactions.list(params=params))
        lines: list[SettlementLine] = []
        for txn in page.auto_paging_iter():
            if txn.type not in ("charge", "payment", "refund", "transfer"):
                continue
            source = txn.source
            metadata = _metadata(source)
            if txn.type == "transfer":  # a payout's first leg: the platform's money leaving for the connected account
                # Net of what was reversed since (a payout failed later, its money taken back): a fully
                # reversed transfer left nothing, and is no line.
                net = int(txn.amount) + int(getattr(source, "amount_reversed", 0) or 0)
                if metadata.get("tally_payout") and net:
                    lines.append(SettlementLine(psp_reference=str(getattr(source, "id", "")), kind="payout", amount=net,
                                                currency=str(txn.currency).upper(), reference=str(metadata["tally_payout"])))
                continue
            intent = getattr(source, "payment_intent", None) or getattr(source, "id", "")
            lines.append(
                SettlementLine(
                    psp_reference=str(getattr(intent, "id", intent)), kind="refund" if txn.type == "refund" else "charge",
                    amount=int(txn.amount), currency=str(txn.currency).upper(), reference=str(metadata.get("tally_topup", "")),
                )
            )
        return SettlementReport(day=day, lines=lines)

    def event_parse(self, body: bytes) -> PspEvent:
        event = json.loads(body)
        obj = event["data"]["object"]
        kind = _EVENT_KINDS.get(str(event["type"]), "other")
        last_error = obj.get("last_payment_error") or {}
        failure_code = obj.get("failure_code") if kind.startswith("payout") else last_error.get("decline_code") or last_error.get("code")
        if event["type"] == "payout.canceled":
            failure_code = failure_code or "canceled"
        return PspEvent(
            id=str(event["id"]), type=str(event["type"]), kind=kind,  # type: ignore[arg-type]
            reference=str((obj.get("metadata") or {}).get("tally_payout" if kind.startswith("payout") else "tally_topup", "")),
            psp_reference=str(obj.get("id", "")), failure_code=str(failure_code or ""), created=_ts(obj.get("created")),
            amount=int(obj.get("amount") or 0), currency=str(obj.get("currency") or "").upper(),
        )

    def bank_account_attach(self, *, token: str, reference: str, current: str = "") -> BankAccountResult:
        """A new connected account for the merchant holding the bank account, or, with
        `current`, the bank account added to the merchant's connected account as its default,
        the account set (again) to pay out manually first: one made before Tally asked for
        that, or changed at Stripe since, would otherwise pay out on its own what a failed
        payout leaves there."""
        account_id = current.split("/", 1)[0] if current.startswith("acct_") else ""
        # Only the saga pays out: money a failed payout leaves on the account waits to be reversed.
        manual: Any = {"payouts": {"schedule": {"interval": "manual"}}}
        if not account_id:
            params: Any = {
                "type": "custom", "metadata": {"tally_merchant": reference}, "external_account": token,
                "capabilities": {"transfers": {"requested": True}}, "settings": manual,
            }
            options: Any = {"idempotency_key": f"{reference}:account:{token}"}
            account = self._call("bank_account_attach", lambda: self.client.v1.accounts.create(params=params, options=options))
            account_id, bank = str(account.id), account.external_accounts.data[0]
        else:
            schedule: Any = {"settings": manual}
            self._call("bank_account_attach", lambda: self.client.v1.accounts.update(account_id, params=schedule))
            bank_params: Any = {"external_account": token, "default_for_currency": True}
            bank_options: Any = {"idempotency_key": f"{reference}:bank:{token}"}
            bank = self._call(
                "bank_account_attach",
                lambda: self.client.v1.accounts.external_accounts.create(account_id, params=bank_params, options=bank_options),
            )
        return BankAccountResult(psp_reference=f"{account_id}/{bank.id}", last4=str(bank.last4))

    def payout_create(self, request: PayoutRequest) -> PayoutResult:
        account_id, _, bank_id = request.destination.partition("/")
        metadata = {"tally_payout": request.reference}
        transfer_params: Any = {
            "amount": request.amount, "currency": request.currency.lower(), "destination": account_id,
            "transfer_group": request.reference, "metadata": metadata,
        }
        transfer_options: Any = {"idempotency_key": f"{request.idempotency_key}:transfer"}
        transfer = self._call("payout", lambda: self.client.v1.transfers.create(params=transfer_params, options=transfer_options))
        payout_params: Any = {"amount": request.amount, "currency": request.currency.lower(), "destination": bank_id, "metadata": metadata}
        payout_options: Any = {"idempotency_key": request.idempotency_key, "stripe_account": account_id}
        try:
            payout = self._call("payout", lambda: self.client.v1.payouts.create(params=payout_params, options=payout_options))
        except GatewayRejected as exc:
            # Refused on the connected account: the transfer's money is there, and only its reversal brings it back.
            reversal_options: Any = {"idempotency_key": _reversal_key(f"{request.idempotency_key}:reversal", transfer)}
            try:
                self._call("payout", lambda: self.client.v1.transfers.reversals.create(str(transfer.id), options=reversal_options))
            except GatewayRejected as refused:
                raise GatewayReturnRefused(
                    f"payout: Stripe refused the payout ({exc.code or 'payout_refused'}), then the reversal of its transfer {transfer.id}"
                    f" ({refused.code or 'invalid_request'})", failure_code=str(exc.code or "payout_refused"),
                ) from refused
            return PayoutResult(status="failed", psp_reference="", amount=request.amount, currency=request.currency.upper(),
                                failure_code=str(exc.code or "payout_refused"))
        return _payout_result(payout)

    def payouts_of(self, *, reference: str, destination: str, psp_reference: str = "", since: datetime | None = None) -> list[PayoutResult]:
        # Stripe lists payouts by account, not by metadata: the one we know by its id, else every
        # page of the connected account's payouts since ours was made, ours picked out.
        account_id = destination.partition("/")[0]
        options: Any = {"stripe_account": account_id}
        if psp_reference:
            known = self._call("payouts_of", lambda: self.client.v1.payouts.retrieve(psp_reference, options=options))
            return [_payout_result(known)] if _metadata(known).get("tally_payout") == reference else []
        params: Any = {"limit": 100}
        if since is not None:
            params["created"] = {"gte": int(since.timestamp()) - 3600}  # an hour of clock skew between us and Stripe
        page = self._call("payouts_of", lambda: self.client.v1.payouts.list(params=params, options=options))
        found = [_payout_result(p) for p in self._call("payouts_of", lambda: list(page.auto_paging_iter()))
                 if _metadata(p).get("tally_payout") == reference]
        if not found:
            if any(_transfer_left(t) for t in self._transfers_of(reference)):
                # The money reached the connected account, and no payout of it is in sight.
                raise GatewayUnavailable(f"payouts_of: a transfer for {reference} without its payout")
        return found

    def _transfers_of(self, reference: str) -> list[Any]:
        """Our payout's transfers to the connected account (one, unless something went wrong)."""
        params: Any = {"transfer_group": reference, "limit": 10}
        transfers = self._call("payouts_of", lambda: self.client.v1.transfers.list(params=params))
        return [t for t in transfers.data if _metadata(t).get("tally_payout") == reference]

    def payout_return(self, *, reference: str, psp_reference: str, destination: str, idempotency_key: str) -> None:
        """Reverse what is left of the payout's transfer: the money of a payout Stripe failed or
        canceled is back on the connected account, and comes back to the platform only so.
        Stripe refuses a reversal the connected account's balance does not cover (a 400:
        GatewayRejected, a person looks)."""
        # No transfer: no money of it reached the connected account, so nothing is there to take back.
        for transfer in self._transfers_of(reference):
            if not _transfer_left(transfer):
                continue  # reversed already (by an earlier attempt whose answer was lost, or at once)
            options: Any = {"idempotency_key": _reversal_key(idempotency_key, transfer)}
            self._call("payout_return", lambda t=transfer, o=options: self.client.v1.transfers.reversals.create(str(t.id), options=o))

    def destination_balance(self, *, destination: str) -> dict[str, int]:
        account_id = destination.partition("/")[0]
        options: Any = {"stripe_account": account_id}
        balance = self._call("destination_balance", lambda: self.client.v1.balance.retrieve(options=options))
        totals: dict[str, int] = {}
        for part in ("available", "pending"):
            for entry in getattr(balance, part, None) or []:
                code = str(entry.currency).upper()
                totals[code] = totals.get(code, 0) + int(entry.amount)
        return totals


def _reversal_key(key: str, transfer: Any) -> str:
    """A transfer's reversal key, `<payout id>:reversal:<transfer id>`: the same transfer gets
    the same key whichever step reverses it (the refused payout's at once, or `payout_return`)
    and in whatever order Stripe lists the transfers."""
    return f"{key}:{transfer.id}"


def _transfer_left(transfer: Any) -> int:
    """What of a transfer was not reversed."""
    return int(transfer.amount) - int(getattr(transfer, "amount_reversed", 0) or 0)


def _ts(value: Any) -> datetime | None:
    return datetime.fromtimestamp(int(value), UTC) if isinstance(value, int) else None


def _metadata(obj: Any) -> dict[str, Any]:
    raw: Any = getattr(obj, "metadata", None) or {}
    return dict(raw.to_dict() if hasattr(raw, "to_dict") else raw)


def _payout_result(payout: Any) -> PayoutResult:
    status = {"paid": "paid", "failed": "failed", "canceled": "failed"}.get(str(payout.status), "in_transit")
    failure_code = str(getattr(payout, "failure_code", None) or ("canceled" if str(payout.status) == "canceled" else ""))
    return PayoutResult(
        status=status, psp_reference=str(payout.id), amount=int(payout.amount), currency=str(payout.currency).upper(),  # type: ignore[arg-type]
        failure_code=failure_code, arrival=_ts(getattr(payout, "arrival_date", None)),
        created=_ts(getattr(payout, "created", None)),
    )


def _result_of(intent: Any, *, failure_code: str = "") -> ChargeResult:
    """A settled PaymentIntent as a charge outcome."""
    return ChargeResult(
        status="succeeded" if str(intent.status) == "succeeded" else "failed", psp_reference=str(intent.id), amount=int(intent.amount),
        currency=str(intent.currency).upper(), failure_code=failure_code, created=_ts(intent.created),
    )
