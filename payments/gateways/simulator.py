"""The simulator adapter: the gateway of development and tests (devtools/psp_simulator.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, date, datetime
from typing import Any

from payments.gateways import metrics
from payments.gateways.base import (
    BankAccountResult,
    ChargeRequest,
    ChargeResult,
    GatewayRejected,
    GatewayUnavailable,
    PayoutRequest,
    PayoutResult,
    PspEvent,
    RefundResult,
    SettlementLine,
    SettlementReport,
    time_limit_reraise,
)


class SimulatorGateway:
    name = "simulator"

    def __init__(self, *, api_base: str, secret_key: str, timeout: float) -> None:
        self.api_base = api_base.rstrip("/")
        self.secret_key = secret_key
        self.timeout = timeout

    def _call(self, operation: str, method: str, path: str, body: dict[str, Any] | None = None, idempotency_key: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.secret_key}", "Content-Type": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.api_base + path, data=data, headers=headers, method=method)  # noqa: S310 - operator-set URL
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read()).get("error", {})
                error_type, param, code = error.get("type"), error.get("param"), error.get("code")
            except (ValueError, OSError, AttributeError):
                error_type = param = code = None
            if exc.code >= 500 or exc.code in (401, 403, 409, 429) or error_type == "idempotency_error":
                metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="unavailable").inc()
                raise GatewayUnavailable(f"{operation}: PSP answered {exc.code} ({error_type or 'no error type'})") from exc
            metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="rejected").inc()
            raise GatewayRejected(f"{operation}: PSP refused the request ({exc.code} {code or 'invalid_request'})", param=param, code=code) from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:  # timeout, reset, truncated answer
            time_limit_reraise(exc)  # urllib wraps only OSError, but a reason may carry the task's time limit
            metrics.PSP_CALL_ERRORS.labels(gateway=self.name, operation=operation, kind="unavailable").inc()
            raise GatewayUnavailable(f"{operation}: no answer from the PSP ({exc})") from exc
        finally:
            metrics.PSP_CALL_SECONDS.labels(gateway=self.name, operation=operation).observe(time.monotonic() - started)
        return payload

    def charge(self, request: ChargeRequest) -> ChargeResult:
        body = {
            "amount": request.amount, "currency": request.currency.lower(), "payment_method": request.payment_method,
            "metadata": {"tally_topup": request.reference},
        }
        try:
            charge = self._call("charge", "POST", "/v1/charges", body, idempotency_key=request.idempotency_key)
        except GatewayRejected as exc:
            if exc.param != "payment_method":
                raise
            return ChargeResult(status="failed", psp_reference="", amount=request.amount, currency=request.currency.upper(),
                                failure_code="payment_method_invalid")
        return _charge_result(charge)

    def refund(self, *, psp_reference: str, amount: int, idempotency_key: str) -> RefundResult:
        refund = self._call("refund", "POST", "/v1/refunds", {"charge": psp_reference, "amount": amount}, idempotency_key=idempotency_key)
        return RefundResult(psp_reference=str(refund["id"]), amount=int(refund["amount"]))

    def charges_of(self, *, reference: str) -> list[ChargeResult]:
        found = self._call("charges_of", "GET", f"/v1/charges?idempotency_key={urllib.parse.quote(reference)}")
        return [_charge_result(c) for c in found["data"] if (c.get("metadata") or {}).get("tally_topup") == reference]

    def settlement_report(self, *, day: date) -> SettlementReport:
        report = self._call("settlement", "GET", f"/v1/settlements/{day.isoformat()}")
        lines = [
            SettlementLine(
                psp_reference=str(line["id"]), kind=line["type"] if line["type"] in ("refund", "payout") else "charge",
                amount=int(line["amount"]), currency=str(line["currency"]).upper(),
                reference=str((line.get("metadata") or {}).get("tally_payout" if line["type"] == "payout" else "tally_topup", "")),
            )
            for line in report["lines"]
        ]
        return SettlementReport(day=day, lines=lines)

    def event_parse(self, body: bytes) -> PspEvent:
        event = json.loads(body)
        obj = event["data"]["object"]
        kind = _EVENT_KINDS.get(str(event["type"]), "other")
        metadata = obj.get("metadata") or {}
        return PspEvent(
            id=str(event["id"]), type=str(event["type"]), kind=kind,  # type: ignore[arg-type]
            reference=str(metadata.get("tally_payout" if kind.startswith("payout") else "tally_topup", "")), psp_reference=str(obj.get("id", "")),
            failure_code=str(obj.get("failure_code") or ""), created=_ts(obj.get("created")),
            amount=int(obj.get("amount") or 0), currency=str(obj.get("currency") or "").upper(),
        )

    def bank_account_attach(self, *, token: str, reference: str, current: str = "") -> BankAccountResult:
        body = {"token": token, "metadata": {"tally_merchant": reference}}
        bank = self._call("bank_account_attach", "POST", "/v1/bank_accounts", body, idempotency_key=f"{reference}:{token}")
        return BankAccountResult(psp_reference=str(bank["id"]), last4=str(bank["last4"]))

    def payout_create(self, request: PayoutRequest) -> PayoutResult:
        body = {
            "amount": request.amount, "currency": request.currency.lower(), "destination": request.destination,
            "metadata": {"tally_payout": request.reference},
        }
        return _payout_result(self._call("payout", "POST", "/v1/payouts", body, idempotency_key=request.idempotency_key))

    def payouts_of(self, *, reference: str, destination: str, psp_reference: str = "", since: datetime | None = None) -> list[PayoutResult]:
        # The simulator looks payouts up by our reference itself: one answer, no pages.
        found = self._call("payouts_of", "GET", f"/v1/payouts?reference={urllib.parse.quote(reference)}")
        return [_payout_result(p) for p in found["data"] if (p.get("metadata") or {}).get("tally_payout") == reference]

    def payout_return(self, *, reference: str, psp_reference: str, destination: str, idempotency_key: str) -> None:
        # The PSP never named a payout of it: each it holds under our reference is reversed (none: nothing to take back).
        found = [psp_reference] if psp_reference else [p.psp_reference for p in self.payouts_of(reference=reference, destination=destination)]
        for psp_id in found:
            self._call("payout_return", "POST", f"/v1/payouts/{urllib.parse.quote(psp_id, safe='')}/reversals", {},
                       idempotency_key=f"{idempotency_key}:{psp_id}")

    def destination_balance(self, *, destination: str) -> dict[str, int]:
        bank = self._call("destination_balance", "GET", f"/v1/bank_accounts/{urllib.parse.quote(destination, safe='')}")
        return {str(code).upper(): int(amount) for code, amount in (bank.get("balance") or {}).items()}


_EVENT_KINDS = {
    "charge.succeeded": "charge_succeeded", "charge.failed": "charge_failed", "payout.paid": "payout_paid", "payout.failed": "payout_failed",
}


def _payout_result(payout: dict[str, Any]) -> PayoutResult:
    status = {"paid": "paid", "failed": "failed", "canceled": "failed"}.get(str(payout["status"]), "in_transit")
    return PayoutResult(
        status=status, psp_reference=str(payout["id"]), amount=int(payout["amount"]),  # type: ignore[arg-type]
        currency=str(payout["currency"]).upper(), failure_code=str(payout.get("failure_code") or ""),
        arrival=_ts(payout.get("arrival_date")), created=_ts(payout.get("created")),
    )


def _ts(value: Any) -> datetime | None:
    return datetime.fromtimestamp(int(value), UTC) if isinstance(value, int) else None


def _charge_result(charge: dict[str, Any]) -> ChargeResult:
    return ChargeResult(
        status="succeeded" if charge["status"] == "succeeded" else "failed", psp_reference=str(charge["id"]),
        amount=int(charge["amount"]), currency=str(charge["currency"]).upper(), failure_code=str(charge.get("failure_code") or ""),
        created=_ts(charge.get("created")),
    )
