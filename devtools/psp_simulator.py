"""The PSP simulator: a small external card processor for development and tests.

Run it as its own process (the `psp` line of the Procfile, and the tests' fixture):

    python -m devtools.psp_simulator --port 8766

Standard library only (no Django): it stands for a system outside Tally. Its state
(accounts, charges, refunds, webhook endpoints) lives in memory for as long as the
process runs. API (JSON in, JSON out, `Authorization: Bearer <api key>`; an unknown key
opens a new account, like a test-mode key):

    POST /v1/charges            {amount, currency, payment_method, metadata}  + Idempotency-Key
    GET  /v1/charges            ?idempotency_key=...   the account's charges
    POST /v1/refunds            {charge, amount}                              + Idempotency-Key
    POST /v1/bank_accounts      {token, metadata}                             + Idempotency-Key
    POST /v1/payouts            {amount, currency, destination, metadata}     + Idempotency-Key
    GET  /v1/payouts            ?reference=...   the account's payouts (metadata tally_payout)
    POST /v1/payouts/<id>/reversals  {}  take back a failed payout's money     + Idempotency-Key
    GET  /v1/bank_accounts/<id> the bank account, with `balance` {currency: minor units}: what
                                the PSP holds for it (a payout failed later, not taken back)
    GET  /v1/settlements/<day>  the day's (UTC) settled charges, refunds and payouts (a failed
                                one only while its money is out, not yet reversed), with totals
    POST /v1/webhook_endpoints  {url, secret}  where signed events go (Psp-Signature: t=..,v1=..)

Test cards: `pm_card_visa`, `pm_card_mastercard` (succeed), `pm_card_declined`
(card_declined), `pm_card_insufficient_funds` (insufficient_funds). Test bank tokens:
`btok_bank` (payouts arrive), `btok_bank_declined` (a payout to it fails at once,
account_closed), `btok_bank_returned` (a payout to it goes in transit, then fails as
returned, no_account). A payout is `in_transit`, then `paid` (or failed, returned)
`payout_settle_ms` later, each with its signed `payout.paid` / `payout.failed` event. The
same Idempotency-Key with the same parameters returns the first answer; with other
parameters a 400 `idempotency_error`. As at Stripe, where a payout goes through the
merchant's connected account, the money of a payout that fails after it went in transit
stays with the bank account (its `balance`) until the caller takes it back (a reversal,
which takes nothing for one declined at once); a reversal of a payout that has not failed
is a 400 `payout_not_failed`.

Faults (POST /_control/faults, JSON; any subset): `latency_ms` (every API call),
`charge_latency_ms` (charges only, before anything is decided: refunds and reads answer at once),
`fail_5xx` (the next N API calls answer 500 before doing anything), `hang_after_charge`
(the next N charges are made, then the answer is held `hang_seconds` and the connection
dropped: a timeout after it has charged), `duplicate_webhooks` (each event sent twice),
`out_of_order_webhooks` (events held until POST /_control/flush_webhooks, then sent
newest first), `webhook_before_response` (the event is delivered before the charge's
answer is sent), `min_charge_amount` (a charge below it is refused with a 400
`amount_too_small`, as Stripe refuses amounts under its minimum: nothing charged, no
idempotent result kept). Payouts: `hang_after_payout` (the next N payouts are made, then the
answer is held `hang_seconds` and dropped), `fail_after_payout` (the next N payouts are made,
then answered 500), `payouts_manual` (payouts stay in transit until POST
/_control/settle_payouts), `payout_settle_ms`, `payout_arrival_seconds` (the arrival it
promises); POST /_control/return_payout {id} fails an in-transit or paid payout as returned.
Reversals: `fail_reversal` (the next N answer 500 before doing anything), `refuse_reversal`
(the next N are refused, a 400 `insufficient_funds`, nothing taken back).
POST /_control/reset clears faults and data; GET /_control/state dumps it.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SIGNATURE_HEADER = "Psp-Signature"
CARDS: dict[str, str | None] = {
    "pm_card_visa": None,
    "pm_card_mastercard": None,
    "pm_card_declined": "card_declined",
    "pm_card_insufficient_funds": "insufficient_funds",
}
# token -> (last four digits, what befalls a payout to it: "" paid, "declined:" at once, "returned:" later)
BANK_TOKENS: dict[str, tuple[str, str]] = {
    "btok_bank": ("6789", ""),
    "btok_bank_declined": ("0002", "declined:account_closed"),
    "btok_bank_returned": ("0003", "returned:no_account"),
}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _error(message: str, *, kind: str = "invalid_request_error", **extra: str) -> dict[str, Any]:
    """An error body in Stripe's shape: {"error": {"type", "message", "code"?, "param"?}}."""
    return {"error": {"type": kind, "message": message, **extra}}


def signature_header_for(*, secret: str, body: bytes, timestamp: int) -> str:
    """`t=<unix>,v1=<hex HMAC-SHA256 over "t.body">` (the scheme Stripe uses)."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@dataclass
class Faults:
    latency_ms: int = 0
    charge_latency_ms: int = 0
    fail_5xx: int = 0
    hang_after_charge: int = 0
    hang_seconds: float = 30.0
    duplicate_webhooks: bool = False
    out_of_order_webhooks: bool = False
    webhook_before_response: bool = False
    min_charge_amount: int = 0
    hang_after_payout: int = 0
    fail_after_payout: int = 0
    payouts_manual: bool = False
    payout_settle_ms: int = 500
    payout_arrival_seconds: int = 86400
    fail_reversal: int = 0
    refuse_reversal: int = 0


@dataclass
class Account:
    api_key: str
    endpoints: list[dict[str, str]] = field(default_factory=list)
    charges: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> charge
    refunds: dict[str, dict[str, Any]] = field(default_factory=dict)
    bank_accounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    payouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (operation, idempotency key) -> (params fingerprint, status, body)
    idempotent: dict[tuple[str, str], tuple[str, int, dict[str, Any]]] = field(default_factory=dict)


class Simulator:
    """All state, under one lock (a charge is decided and recorded atomically)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.accounts: dict[str, Account] = {}
        self.faults = Faults()
        self.held_events: list[tuple[Account, dict[str, Any]]] = []
        self.webhook_log: list[dict[str, Any]] = []
        # In-transit payouts due to settle: (due monotonic time, account, payout id), one thread settles them.
        self.payouts_due: list[tuple[float, Account, str]] = []
        threading.Thread(target=self._payouts_settler, daemon=True).start()

    def account(self, api_key: str) -> Account:
        with self.lock:
            return self.accounts.setdefault(api_key, Account(api_key=api_key))

    # --- API ---------------------------------------------------------------------------

    def idempotent(
        self, acct: Account, operation: str, key: str, params: dict[str, Any], make: Callable[[], tuple[int, dict[str, Any]]]
    ) -> tuple[int, dict[str, Any]]:
        fingerprint = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
        with self.lock:
            seen = acct.idempotent.get((operation, key))
            if seen is not None:
                if seen[0] != fingerprint:
                    return 400, _error("key reused with other parameters", kind="idempotency_error")
                return seen[1], seen[2]
            status, body = make()
            acct.idempotent[(operation, key)] = (fingerprint, status, body)
            return status, body

    def charge_create(self, acct: Account, key: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        amount, currency, method = params.get("amount"), params.get("currency"), params.get("payment_method")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0 or not isinstance(currency, str) or not currency:
            return 400, _error("amount (positive integer) and currency are required"), None
        with self.lock:
            minimum = self.faults.min_charge_amount
        if amount < minimum:
            return 400, _error(f"Amount must be at least {minimum} {currency.lower()}", code="amount_too_small", param="amount"), None
        if method not in CARDS:
            return 400, _error(f"no such payment method: {method}", code="resource_missing", param="payment_method"), None
        event: dict[str, Any] | None = None

        def make() -> tuple[int, dict[str, Any]]:
            nonlocal event
            decline = CARDS[str(method)]
            charge = {
                "id": _new_id("ch"), "object": "charge", "amount": amount, "currency": currency.lower(),
                "payment_method": method, "status": "failed" if decline else "succeeded", "failure_code": decline or "",
                "amount_refunded": 0, "metadata": dict(params.get("metadata") or {}), "idempotency_key": key,
                "created": int(time.time()),
            }
            acct.charges[str(charge["id"])] = charge
            event = self.event_make("charge.failed" if decline else "charge.succeeded", charge)
            return 200, dict(charge)

        status, body = self.idempotent(acct, "charge", key, params, make)
        return status, body, event

    def refund_create(self, acct: Account, key: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        event: dict[str, Any] | None = None

        def make() -> tuple[int, dict[str, Any]]:
            nonlocal event
            charge = acct.charges.get(str(params.get("charge")))
            amount = params.get("amount")
            if charge is None or charge["status"] != "succeeded":
                return 400, _error("no such succeeded charge")
            if not isinstance(amount, int) or amount <= 0 or amount > charge["amount"] - charge["amount_refunded"]:
                return 400, _error("invalid refund amount")
            charge["amount_refunded"] += amount
            refund = {
                "id": _new_id("re"), "object": "refund", "charge": charge["id"], "amount": amount, "currency": charge["currency"],
                "status": "succeeded", "metadata": dict(charge["metadata"]), "created": int(time.time()),
            }
            acct.refunds[str(refund["id"])] = refund
            event = self.event_make("charge.refunded", dict(charge))
            return 200, dict(refund)

        status, body = self.idempotent(acct, "refund", key, params, make)
        return status, body, event

    def bank_account_create(self, acct: Account, key: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        token = params.get("token")
        if token not in BANK_TOKENS:
            return 400, _error(f"no such bank account token: {token}", code="resource_missing", param="token")

        def make() -> tuple[int, dict[str, Any]]:
            last4, fate = BANK_TOKENS[str(token)]
            bank = {"id": _new_id("ba"), "object": "bank_account", "last4": last4, "fate": fate,
                    "metadata": dict(params.get("metadata") or {}), "created": int(time.time()), "balance": {}}
            acct.bank_accounts[str(bank["id"])] = bank
            return 200, _bank_view(bank)

        return self.idempotent(acct, "bank_account", key, params, make)

    def payout_create(self, acct: Account, key: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        amount, currency, destination = params.get("amount"), params.get("currency"), params.get("destination")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0 or not isinstance(currency, str) or not currency:
            return 400, _error("amount (positive integer) and currency are required"), None
        with self.lock:
            bank = acct.bank_accounts.get(str(destination))
        if bank is None:
            return 400, _error(f"no such bank account: {destination}", code="resource_missing", param="destination"), None
        event: dict[str, Any] | None = None

        def make() -> tuple[int, dict[str, Any]]:
            nonlocal event
            declined = bank["fate"].startswith("declined:")
            now = int(time.time())
            payout = {
                "id": _new_id("po"), "object": "payout", "amount": amount, "currency": currency.lower(), "destination": destination,
                "status": "failed" if declined else "in_transit", "failure_code": bank["fate"].split(":", 1)[1] if declined else "",
                "metadata": dict(params.get("metadata") or {}), "idempotency_key": key, "created": now,
                "arrival_date": now + self.faults.payout_arrival_seconds,
            }
            acct.payouts[str(payout["id"])] = payout
            if declined:
                event = self.event_make("payout.failed", payout)
            elif not self.faults.payouts_manual:
                self.payouts_due.append((time.monotonic() + self.faults.payout_settle_ms / 1000.0, acct, str(payout["id"])))
            return 200, dict(payout)

        status, body = self.idempotent(acct, "payout", key, params, make)
        return status, body, event

    def payout_settle(self, acct: Account, payout_id: str, *, returned: bool = False) -> bool:
        """An in-transit payout arrives (or fails, to a returning account); `returned`: an
        in-transit or paid one fails as returned. Its event is sent."""
        with self.lock:
            payout = acct.payouts.get(payout_id)
            if payout is None or payout["status"] not in (("in_transit", "paid") if returned else ("in_transit",)):
                return False
            bank = acct.bank_accounts[str(payout["destination"])]
            fate = bank["fate"]
            if returned or fate.startswith("returned:"):
                payout["status"], payout["failure_code"] = "failed", fate.split(":", 1)[1] if ":" in fate else "no_account"
                # Back from the bank to the merchant's holding at the PSP, until the caller takes it back.
                balance = bank.setdefault("balance", {})
                balance[payout["currency"]] = int(balance.get(payout["currency"], 0)) + int(payout["amount"])
                payout["held_back"] = True
            else:
                payout["status"] = "paid"
            event = self.event_make(f"payout.{payout['status']}", payout)
        self.events_dispatch(acct, event)
        return True

    def payout_reverse(self, acct: Account, payout_id: str, key: str) -> tuple[int, dict[str, Any]]:
        """Take back what a failed payout left with its bank account (nothing for one declined
        at once, or taken back already under another key)."""
        with self.lock:
            payout = acct.payouts.get(payout_id)
            if payout is None:
                return 404, _error(f"no such payout: {payout_id}", code="resource_missing", param="id")
            if payout["status"] != "failed":
                return 400, _error(f"payout {payout_id} is {payout['status']}, not failed", code="payout_not_failed")
            if self.faults.refuse_reversal > 0:
                self.faults.refuse_reversal -= 1
                return 400, _error("the bank account's balance does not cover the reversal", code="insufficient_funds")

        def make() -> tuple[int, dict[str, Any]]:
            amount = int(payout["amount"]) if payout.get("held_back") and not payout.get("reversed") else 0
            if amount:
                balance = acct.bank_accounts[str(payout["destination"])]["balance"]
                balance[payout["currency"]] = int(balance.get(payout["currency"], 0)) - amount
            payout["reversed"] = True
            return 200, {"id": _new_id("prv"), "object": "payout_reversal", "payout": payout_id, "amount": amount,
                         "currency": payout["currency"], "created": int(time.time())}

        return self.idempotent(acct, "payout_reversal", key, {"payout": payout_id}, make)

    def payouts_settle_all(self) -> int:
        with self.lock:
            in_transit = [(a, p) for a in self.accounts.values() for p, row in a.payouts.items() if row["status"] == "in_transit"]
        return sum(1 for acct, payout_id in in_transit if self.payout_settle(acct, payout_id))

    def _payouts_settler(self) -> None:
        while True:
            time.sleep(0.05)
            with self.lock:
                now = time.monotonic()
                due = [d for d in self.payouts_due if d[0] <= now]
                self.payouts_due = [d for d in self.payouts_due if d[0] > now]
            for _, acct, payout_id in due:
                self.payout_settle(acct, payout_id)

    def settlement(self, acct: Account, day: str) -> dict[str, Any]:
        with self.lock:
            def on_day(created: int) -> bool:
                return datetime.fromtimestamp(created, UTC).date().isoformat() == day

            lines = [
                {"type": "charge", "id": c["id"], "amount": c["amount"], "currency": c["currency"], "metadata": c["metadata"],
                 "idempotency_key": c["idempotency_key"]}
                for c in acct.charges.values() if c["status"] == "succeeded" and on_day(int(c["created"]))
            ] + [
                {"type": "refund", "id": r["id"], "charge": r["charge"], "amount": -int(r["amount"]), "currency": r["currency"],
                 "metadata": r["metadata"]}
                for r in acct.refunds.values() if on_day(int(r["created"]))
            ] + [
                {"type": "payout", "id": p["id"], "amount": -int(p["amount"]), "currency": p["currency"], "metadata": p["metadata"]}
                # A failed payout left nothing once its money is back: declined at once, or taken back by a reversal.
                # Failed later and not reversed, its money is still out with the bank account, as Stripe's transfer stays.
                for p in acct.payouts.values()
                if (p["status"] != "failed" or (p.get("held_back") and not p.get("reversed"))) and on_day(int(p["created"]))
            ]
        totals: dict[str, int] = {}
        for line in lines:
            totals[line["currency"]] = totals.get(line["currency"], 0) + int(line["amount"])
        return {"object": "settlement_report", "day": day, "lines": lines, "totals": totals}

    # --- Webhooks ----------------------------------------------------------------------

    def event_make(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {"id": _new_id("evt"), "object": "event", "type": kind, "created": int(time.time()), "data": {"object": dict(obj)}}

    def events_dispatch(self, acct: Account, event: dict[str, Any], *, inline: bool = False) -> None:
        with self.lock:
            if self.faults.out_of_order_webhooks:
                self.held_events.append((acct, event))
                return
            copies = 2 if self.faults.duplicate_webhooks else 1
            if not acct.endpoints:
                return
        for _ in range(copies):
            if inline:
                self.deliver(acct, event)
            else:
                threading.Thread(target=self.deliver, args=(acct, event), daemon=True).start()

    def flush_held(self) -> int:
        with self.lock:
            held, self.held_events = list(reversed(self.held_events)), []
            copies = 2 if self.faults.duplicate_webhooks else 1
        for acct, event in held:  # newest first
            for _ in range(copies):
                self.deliver(acct, event)
        return len(held)

    def deliver(self, acct: Account, event: dict[str, Any]) -> None:
        body = json.dumps(event, separators=(",", ":")).encode("utf-8")
        for endpoint in list(acct.endpoints):
            for attempt in range(5):
                status = _post_signed(endpoint, body)
                with self.lock:
                    self.webhook_log.append({"event": event["id"], "type": event["type"], "url": endpoint["url"], "status": status})
                if 200 <= status < 300:
                    break
                time.sleep(0.2 * 2**attempt)


def _post_signed(endpoint: dict[str, str], body: bytes) -> int:
    """POST a signed event. A `*.localhost` host is reached on 127.0.0.1, its name sent as Host."""
    parts = urlsplit(endpoint["url"])
    host = parts.hostname or "127.0.0.1"
    connect = "127.0.0.1" if host.endswith(".localhost") or host == "localhost" else host
    netloc = connect + (f":{parts.port}" if parts.port else "")
    url = f"{parts.scheme}://{netloc}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature_header_for(secret=endpoint["secret"], body=body, timestamp=int(time.time())),
        "Host": host + (f":{parts.port}" if parts.port else ""),
    }
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - URL set by the operator
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def _bank_view(bank: dict[str, Any]) -> dict[str, Any]:
    """A bank account as the API shows it: its fate stays the simulator's."""
    return {**{k: v for k, v in bank.items() if k != "fate"}, "balance": dict(bank.get("balance") or {})}


def _make_handler(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _json_body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return {}
            value = json.loads(raw)
            return value if isinstance(value, dict) else {}

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, separators=(",", ":")).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _account(self) -> Account | None:
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or len(auth) < 12:
                self._send(401, _error("bearer api key required", kind="authentication_error"))
                return None
            return sim.account(auth[len("Bearer "):])

        def _api_faults(self) -> bool:
            """Latency, then an injected 5xx. True when the call was answered here."""
            with sim.lock:
                latency = sim.faults.latency_ms
                fail = sim.faults.fail_5xx > 0
                if fail:
                    sim.faults.fail_5xx -= 1
            if latency:
                time.sleep(latency / 1000.0)
            if fail:
                self._send(500, _error("injected failure", kind="api_error"))
            return fail

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/healthz":
                self._send(200, {"ok": True})
                return
            if parts.path == "/_control/state":
                with sim.lock:
                    state = {
                        "accounts": {k: {"charges": list(a.charges.values()), "refunds": list(a.refunds.values()),
                                         "payouts": list(a.payouts.values()), "endpoints": len(a.endpoints)}
                                     for k, a in sim.accounts.items()},
                        "webhooks": list(sim.webhook_log), "held_events": len(sim.held_events),
                    }
                self._send(200, state)
                return
            acct = self._account()
            if acct is None or self._api_faults():
                return
            if parts.path == "/v1/charges":
                key = parse_qs(parts.query).get("idempotency_key", [None])[0]
                with sim.lock:
                    data = [c for c in acct.charges.values() if key is None or c["idempotency_key"] == key]
                self._send(200, {"object": "list", "data": data})
            elif parts.path == "/v1/payouts":
                reference = parse_qs(parts.query).get("reference", [None])[0]
                with sim.lock:
                    data = [p for p in acct.payouts.values() if reference is None or p["metadata"].get("tally_payout") == reference]
                self._send(200, {"object": "list", "data": data})
            elif parts.path.startswith("/v1/bank_accounts/"):
                with sim.lock:
                    bank = acct.bank_accounts.get(parts.path.rsplit("/", 1)[1])
                    view = _bank_view(bank) if bank is not None else None
                if view is None:
                    self._send(404, _error("no such bank account", code="resource_missing", param="id"))
                else:
                    self._send(200, view)
            elif parts.path.startswith("/v1/settlements/"):
                self._send(200, sim.settlement(acct, parts.path.rsplit("/", 1)[1]))
            else:
                self._send(404, _error("unknown path"))

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            try:
                params = self._json_body()
            except (ValueError, UnicodeDecodeError):
                self._send(400, _error("body must be a JSON object"))
                return
            if path.startswith("/_control/"):
                self._control(path, params)
                return
            acct = self._account()
            if acct is None or self._api_faults():
                return
            if path == "/v1/webhook_endpoints":
                url, secret = params.get("url"), params.get("secret")
                if not isinstance(url, str) or not isinstance(secret, str) or not secret:
                    self._send(400, _error("url and secret are required"))
                    return
                with sim.lock:
                    acct.endpoints = [e for e in acct.endpoints if e["url"] != url] + [{"url": url, "secret": secret}]
                self._send(200, {"object": "webhook_endpoint", "url": url})
                return
            key = self.headers.get("Idempotency-Key")
            if not key:
                self._send(400, _error("Idempotency-Key header is required"))
                return
            if path == "/v1/charges":
                with sim.lock:
                    charge_latency = sim.faults.charge_latency_ms
                if charge_latency:
                    time.sleep(charge_latency / 1000.0)
                status, body, event = sim.charge_create(acct, key, params)
                if event is not None:
                    with sim.lock:
                        first = sim.faults.webhook_before_response
                    sim.events_dispatch(acct, event, inline=first)
                    with sim.lock:
                        hang = sim.faults.hang_after_charge > 0
                        if hang:
                            sim.faults.hang_after_charge -= 1
                        hang_seconds = sim.faults.hang_seconds
                    if hang:  # charged; the caller never hears it
                        time.sleep(hang_seconds)
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                self._send(status, body)
            elif path == "/v1/refunds":
                status, body, event = sim.refund_create(acct, key, params)
                if event is not None:
                    sim.events_dispatch(acct, event)
                self._send(status, body)
            elif path == "/v1/bank_accounts":
                self._send(*sim.bank_account_create(acct, key, params))
            elif path.startswith("/v1/payouts/") and path.endswith("/reversals"):
                with sim.lock:
                    fail = sim.faults.fail_reversal > 0
                    if fail:
                        sim.faults.fail_reversal -= 1
                if fail:
                    self._send(500, _error("injected failure before the reversal", kind="api_error"))
                    return
                self._send(*sim.payout_reverse(acct, path.split("/")[3], key))
            elif path == "/v1/payouts":
                status, body, event = sim.payout_create(acct, key, params)
                if event is not None:
                    sim.events_dispatch(acct, event)
                if status == 200 and self._payout_fault():
                    return
                self._send(status, body)
            else:
                self._send(404, _error("unknown path"))

        def _payout_fault(self) -> bool:
            """After a payout was made: a hang then a dropped connection, or a 500. True when answered here."""
            with sim.lock:
                hang, fail = sim.faults.hang_after_payout > 0, sim.faults.fail_after_payout > 0
                if hang:
                    sim.faults.hang_after_payout -= 1
                elif fail:
                    sim.faults.fail_after_payout -= 1
                hang_seconds = sim.faults.hang_seconds
            if hang:
                time.sleep(hang_seconds)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif fail:
                self._send(500, _error("injected failure after the payout", kind="api_error"))
            return hang or fail

        def _control(self, path: str, params: dict[str, Any]) -> None:
            if path == "/_control/faults":
                with sim.lock:
                    for name, value in params.items():
                        if hasattr(sim.faults, name):
                            setattr(sim.faults, name, type(getattr(sim.faults, name))(value))
                    current = dict(sim.faults.__dict__)
                self._send(200, current)
            elif path == "/_control/flush_webhooks":
                self._send(200, {"flushed": sim.flush_held()})
            elif path == "/_control/settle_payouts":
                self._send(200, {"settled": sim.payouts_settle_all()})
            elif path == "/_control/return_payout":
                with sim.lock:
                    owner = next((a for a in sim.accounts.values() if str(params.get("id")) in a.payouts), None)
                self._send(200, {"returned": owner is not None and sim.payout_settle(owner, str(params.get("id")), returned=True)})
            elif path == "/_control/reset":
                with sim.lock:
                    sim.faults = Faults()
                    sim.accounts.clear()
                    sim.held_events.clear()
                    sim.webhook_log.clear()
                    sim.payouts_due.clear()
                self._send(200, {"reset": True})
            else:
                self._send(404, _error("unknown control"))

    return Handler


def serve(*, host: str, port: int, accounts_file: str | None = None) -> None:
    sim = Simulator()
    if accounts_file:
        # {"<api key>": [{"url": ..., "secret": ...}, ...]}: endpoints registered at start; and
        # {"bank_accounts": {"<api key>": [{"id": "ba_...", "token": "btok_bank"}]}}: bank accounts held from the start.
        try:
            with open(accounts_file, encoding="utf-8") as fh:
                for api_key, endpoints in json.load(fh).items():
                    if isinstance(endpoints, list):
                        sim.account(api_key).endpoints = [{"url": str(e["url"]), "secret": str(e["secret"])} for e in endpoints]
                    elif api_key == "bank_accounts" and isinstance(endpoints, dict):
                        for owner, banks in endpoints.items():
                            for bank in banks:
                                last4, fate = BANK_TOKENS[str(bank["token"])]
                                sim.account(owner).bank_accounts[str(bank["id"])] = {
                                    "id": str(bank["id"]), "object": "bank_account", "last4": last4, "fate": fate, "metadata": {},
                                    "created": int(time.time()), "balance": {},
                                }
        except FileNotFoundError:
            pass
    server = ThreadingHTTPServer((host, port), _make_handler(sim))
    server.daemon_threads = True
    print(f"psp simulator listening on http://{host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Tally's PSP simulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--accounts-file", default=None,
                        help="JSON {api_key: [{url, secret}], 'bank_accounts': {api_key: [{id, token}]}}: webhook endpoints and bank accounts"
                        " held from the start")
    args = parser.parse_args(argv)
    serve(host=args.host, port=args.port, accounts_file=args.accounts_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
