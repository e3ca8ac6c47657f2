"""The Stripe adapter (payments/gateways/stripe_gateway.py), the production gateway, through
stripe-python against a local stub server that answers with canned responses in the shapes
of Stripe's API reference (no network here): our key is Stripe's Idempotency-Key, a 402
card_error is a decline, 5xx and no answer are "unknown" (GatewayUnavailable), and the
webhook signature scheme is the one stripe-python itself verifies."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest
import stripe
from django.test import Client

from payments.gateways.base import ChargeRequest, GatewayRejected, GatewayReturnRefused, GatewayUnavailable, PayoutRequest
from payments.gateways.signing import SignatureStale, signature_compute, signature_verify
from payments.gateways.stripe_gateway import StripeGateway
from payments.models import TopUp
from payments.services.topups import gateway_account_set
from tenants.models import Tenant
from tests.conftest import TENANT_A
from tests.receivers import free_port
from wallets.models import Account
from wallets.selectors import account_balance
from wallets.services.principals import api_key_create, customer_create

NOW = int(time.time())


def payment_intent(*, status: str = "succeeded", amount: int = 1000, topup: str = "top_x", **extra: Any) -> dict[str, Any]:
    """A PaymentIntent as Stripe's API reference shows it (the fields we read, and a few more)."""
    return {
        "id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "object": "payment_intent", "amount": amount, "amount_received": amount if status == "succeeded" else 0,
        "capture_method": "automatic", "confirmation_method": "automatic", "created": NOW, "currency": "jpy", "livemode": False,
        "metadata": {"tally_topup": topup}, "payment_method": "pm_card_visa", "payment_method_types": ["card"], "status": status,
        "last_payment_error": None, "latest_charge": "ch_3MtwBwLkdIwHu7ix28a3tqPa", **extra,
    }


CARD_DECLINED = {
    "error": {
        "type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds", "message": "Your card has insufficient funds.",
        "doc_url": "https://stripe.com/docs/error-codes/card-declined", "payment_intent": payment_intent(status="requires_payment_method"),
    }
}
NO_SUCH_PAYMENT_METHOD = {
    "error": {"type": "invalid_request_error", "code": "resource_missing", "param": "payment_method", "message": "No such PaymentMethod: 'pm_x'"}
}
API_ERROR = {"error": {"type": "api_error", "message": "An unknown error occurred"}}
AMOUNT_TOO_SMALL = {
    "error": {"type": "invalid_request_error", "code": "amount_too_small", "param": "amount", "message": "Amount must be at least ¥50 jpy",
              "doc_url": "https://stripe.com/docs/error-codes/amount-too-small"}
}
UNKNOWN_CURRENCY = {"error": {"type": "invalid_request_error", "param": "currency", "message": "Invalid currency: xts."}}
KEY_REUSED = {
    "error": {"type": "idempotency_error",
              "message": "Keys for idempotent requests can only be used with the same parameters they were first used with."}
}
KEY_IN_USE = {
    "error": {"type": "idempotency_error", "code": "idempotency_key_in_use",
              "message": "There is currently another in-progress request using this Idempotent Key."}
}
BAD_KEY = {"error": {"type": "invalid_request_error", "message": "Invalid API Key provided: sk_test_****7dc"}}


@dataclass
class Stub:
    port: int
    script: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub(port=0)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            state.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "form": parse_qs(body)})
            status, payload = state.script.pop(0) if state.script else (500, API_ERROR)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", "req_stub")
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state
    server.shutdown()


def gateway(stub: Stub) -> StripeGateway:
    return StripeGateway(api_base=stub.url, secret_key="sk_test_4eC39HqLyjWDarjtT1zdp7dc", timeout=2.0)


def request(key: str = "top_abc") -> ChargeRequest:
    return ChargeRequest(amount=1000, currency="JPY", payment_method="pm_card_visa", idempotency_key=key, reference=key)


def test_a_charge_is_a_confirmed_payment_intent_under_our_idempotency_key(stub: Stub) -> None:
    stub.script = [(200, payment_intent(topup="top_abc"))]
    result = gateway(stub).charge(request("top_abc"))
    assert result.status == "succeeded" and result.psp_reference == "pi_3MtwBwLkdIwHu7ix28a3tqPa" and result.amount == 1000
    assert result.currency == "JPY" and result.created == datetime.fromtimestamp(NOW, UTC)
    sent = stub.requests[0]
    assert sent["method"] == "POST" and sent["path"] == "/v1/payment_intents"
    assert sent["headers"]["Idempotency-Key"] == "top_abc" and sent["headers"]["Authorization"] == "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc"
    form = {k: v[0] for k, v in sent["form"].items()}
    assert form["amount"] == "1000" and form["currency"] == "jpy" and form["payment_method"] == "pm_card_visa"
    assert form["confirm"] == "true" and form["metadata[tally_topup]"] == "top_abc"
    assert len(stub.requests) == 1  # stripe-python's own retries are off: the saga retries, with the same key


def test_a_card_error_is_a_decline_with_its_code(stub: Stub) -> None:
    stub.script = [(402, CARD_DECLINED)]
    result = gateway(stub).charge(request())
    assert result.status == "failed" and result.failure_code == "insufficient_funds" and result.psp_reference.startswith("pi_")


def test_an_unknown_payment_method_is_a_failure_without_a_charge(stub: Stub) -> None:
    stub.script = [(400, NO_SUCH_PAYMENT_METHOD)]
    result = gateway(stub).charge(request())
    assert result.status == "failed" and result.failure_code == "payment_method_invalid" and result.psp_reference == ""


def test_a_5xx_or_no_answer_is_unknown(stub: Stub) -> None:
    stub.script = [(500, API_ERROR)]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).charge(request())
    closed = StripeGateway(api_base=f"http://127.0.0.1:{free_port()}", secret_key="sk_test_x", timeout=1.0)
    with pytest.raises(GatewayUnavailable):
        closed.charge(request())


@pytest.mark.parametrize(("payload", "param", "code"), [(AMOUNT_TOO_SMALL, "amount", "amount_too_small"), (UNKNOWN_CURRENCY, "currency", None)])
def test_a_refused_request_is_a_rejection_with_stripes_code(stub: Stub, payload: dict[str, Any], param: str, code: str | None) -> None:
    stub.script = [(400, payload)]
    with pytest.raises(GatewayRejected) as refused:
        gateway(stub).charge(request())
    assert refused.value.param == param and refused.value.code == code


@pytest.mark.parametrize(("status", "payload"), [(400, KEY_REUSED), (409, KEY_IN_USE), (401, BAD_KEY), (403, BAD_KEY)])
def test_an_answer_that_says_nothing_of_the_charge_under_our_key_is_unknown(stub: Stub, status: int, payload: dict[str, Any]) -> None:
    """An earlier attempt under the same key may have charged: our key refused (rotated
    since?) or Stripe's idempotency layer objecting must not fail the top-up as uncharged."""
    stub.script = [(status, payload)]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).charge(request())


def test_a_payment_intent_still_processing_is_unknown(stub: Stub) -> None:
    stub.script = [(200, payment_intent(status="processing"))]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).charge(request())


def test_the_settlement_report_reads_the_days_balance_transactions(stub: Stub) -> None:
    txn = {
        "id": "txn_1", "object": "balance_transaction", "amount": 1000, "currency": "jpy", "created": NOW, "type": "charge",
        "source": {"id": "ch_1", "object": "charge", "payment_intent": "pi_1", "metadata": {"tally_topup": "top_1"}},
    }
    payout = {**txn, "id": "txn_2", "type": "payout", "amount": -5000, "source": {"id": "po_1", "object": "payout", "metadata": {}}}
    stub.script = [(200, {"object": "list", "data": [txn, payout], "has_more": False, "url": "/v1/balance_transactions"})]
    report = gateway(stub).settlement_report(day=datetime.now(UTC).date())
    assert [(line.psp_reference, line.kind, line.amount, line.reference) for line in report.lines] == [("pi_1", "charge", 1000, "top_1")]
    assert stub.requests[0]["path"].startswith("/v1/balance_transactions")


def test_our_signature_scheme_is_stripes() -> None:
    body = json.dumps({"id": "evt_1", "object": "event", "type": "payment_intent.succeeded", "data": {"object": payment_intent()}}).encode()
    ts = int(time.time())
    header = f"t={ts},v1={signature_compute(secret='whsec_x', body=body, timestamp=ts)}"
    event = stripe.Webhook.construct_event(body, header, "whsec_x")  # stripe-python verifies what we sign
    assert event["id"] == "evt_1"
    signature_verify(header=header, body=body, secrets=["whsec_x"], now=time.time())
    parsed = StripeGateway(api_base="http://127.0.0.1:9", secret_key="sk_test_x", timeout=1).event_parse(body)
    assert (parsed.kind, parsed.reference, parsed.amount, parsed.currency) == ("charge_succeeded", "top_x", 1000, "JPY")


@pytest.mark.parametrize(("offset", "accepted"), [(-300, True), (300, True), (-301, False), (301, False)])
def test_signature_tolerance_edge(offset: int, accepted: bool) -> None:
    body, signed_at = b'{"id": "evt_1"}', 1_700_000_000
    header = f"t={signed_at},v1={signature_compute(secret='whsec_x', body=body, timestamp=signed_at)}"
    if accepted:
        signature_verify(header=header, body=body, secrets=["whsec_x"], now=signed_at - offset)
    else:
        with pytest.raises(SignatureStale):
            signature_verify(header=header, body=body, secrets=["whsec_x"], now=signed_at - offset)


def test_a_top_up_through_the_stripe_gateway(live_tenant: Tenant, stub: Stub) -> None:
    gateway_account_set(gateway="stripe", api_base=stub.url, secret_key="sk_test_x", webhook_secrets=["whsec_x"])
    try:
        customer = customer_create(name=f"Stripe {uuid.uuid4().hex[:6]}")
        key = api_key_create(principal=customer)[1]
        client = Client(HTTP_HOST=TENANT_A["domain"])
        idem = uuid.uuid4().hex

        def post() -> Any:
            return client.post("/v1/customer/topups", data=json.dumps({"asset": "JPY", "amount": 1000, "payment_method": "pm_card_visa"}),
                               content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_IDEMPOTENCY_KEY=idem)

        stub.script = [(500, API_ERROR)]
        assert post().status_code == 503
        topup = TopUp.objects.get(customer=customer)
        stub.script = [(200, payment_intent(topup=topup.pk))]
        r = post()
        assert r.status_code == 201 and r.json()["id"] == topup.pk
        assert [req["headers"]["Idempotency-Key"] for req in stub.requests] == [topup.pk, topup.pk]
        assert account_balance(account=Account.objects.get(customer=customer), asset_code="JPY")[0] == 1000
    finally:
        from payments.models import GatewayAccount

        GatewayAccount.objects.filter(gateway="stripe").delete()


# --- Payouts through Connect -----------------------------------------------------------------------


def payout_request(reference: str = "po_abc") -> PayoutRequest:
    return PayoutRequest(amount=5000, currency="JPY", destination="acct_1/ba_1", idempotency_key=reference, reference=reference)


def stripe_payout(*, status: str = "in_transit", reference: str = "po_abc", amount: int = 5000, **extra: Any) -> dict[str, Any]:
    return {
        "id": "po_1OaFDbEcg9tTZuTgNYmX0PKB", "object": "payout", "amount": amount, "arrival_date": NOW + 86400, "automatic": False,
        "balance_transaction": "txn_1", "created": NOW, "currency": "jpy", "destination": "ba_1", "failure_code": None,
        "livemode": False, "metadata": {"tally_payout": reference}, "method": "standard", "status": status, "type": "bank_account",
        **extra,
    }


TRANSFER = {
    "id": "tr_1MiN3gLkdIwHu7ixNCZvFdgA", "object": "transfer", "amount": 5000, "currency": "jpy", "destination": "acct_1",
    "transfer_group": "po_abc", "metadata": {"tally_payout": "po_abc"}, "reversed": False, "created": NOW,
}


def test_a_bank_account_is_a_connected_account_with_an_external_account(stub: Stub) -> None:
    stub.script = [(200, {"id": "acct_1", "object": "account", "type": "custom", "metadata": {"tally_merchant": "mer_1"},
                          "external_accounts": {"object": "list", "data": [{"id": "ba_1", "object": "bank_account", "last4": "6789"}]}})]
    bank = gateway(stub).bank_account_attach(token="btok_1", reference="mer_1")
    assert (bank.psp_reference, bank.last4) == ("acct_1/ba_1", "6789")
    form = {k: v[0] for k, v in stub.requests[0]["form"].items()}
    assert stub.requests[0]["path"] == "/v1/accounts" and form["external_account"] == "btok_1" and form["type"] == "custom"
    # Stripe pays out only what the saga asks for: money a failed payout leaves there waits to be reversed.
    assert form["settings[payouts][schedule][interval]"] == "manual"
    # A change: the account (perhaps made before Tally asked for a manual schedule, or changed at Stripe since) is set
    # to pay out manually again before its new bank account is added.
    stub.script = [(200, {"id": "acct_1", "object": "account", "settings": {"payouts": {"schedule": {"interval": "manual"}}}}),
                   (200, {"id": "ba_2", "object": "bank_account", "last4": "1234", "account": "acct_1"})]
    changed = gateway(stub).bank_account_attach(token="btok_2", reference="mer_1", current=bank.psp_reference)
    update, added = stub.requests[1:]
    assert update["method"] == "POST" and update["path"] == "/v1/accounts/acct_1"
    assert {k: v[0] for k, v in update["form"].items()}["settings[payouts][schedule][interval]"] == "manual"
    assert changed.psp_reference == "acct_1/ba_2" and added["path"] == "/v1/accounts/acct_1/external_accounts"
    stub.script = [(400, {"error": {"type": "invalid_request_error", "code": "account_invalid", "message": "No such account"}})]
    with pytest.raises(GatewayRejected):  # not made manual: no bank account added to it
        gateway(stub).bank_account_attach(token="btok_3", reference="mer_1", current=changed.psp_reference)
    assert len(stub.requests) == 4


def test_a_payout_is_a_transfer_then_a_payout_on_the_connected_account_under_our_id(stub: Stub) -> None:
    stub.script = [(200, TRANSFER), (200, stripe_payout())]
    result = gateway(stub).payout_create(payout_request("po_abc"))
    assert result.status == "in_transit" and result.psp_reference.startswith("po_") and result.amount == 5000
    assert result.arrival == datetime.fromtimestamp(NOW + 86400, UTC)
    transfer, payout = stub.requests
    assert transfer["path"] == "/v1/transfers" and transfer["headers"]["Idempotency-Key"] == "po_abc:transfer"
    assert {k: v[0] for k, v in transfer["form"].items()}["transfer_group"] == "po_abc"
    assert payout["path"] == "/v1/payouts" and payout["headers"]["Idempotency-Key"] == "po_abc"
    assert payout["headers"]["Stripe-Account"] == "acct_1"
    assert {k: v[0] for k, v in payout["form"].items()}["destination"] == "ba_1"


def test_a_payout_stripe_refuses_has_its_transfer_reversed_and_fails(stub: Stub) -> None:
    refused = {"error": {"type": "invalid_request_error", "code": "balance_insufficient", "message": "Insufficient funds"}}
    reversal = {"id": "trr_1", "object": "transfer_reversal", "amount": 5000, "currency": "jpy", "transfer": TRANSFER["id"]}
    stub.script = [(200, TRANSFER), (400, refused), (200, reversal)]
    result = gateway(stub).payout_create(payout_request("po_abc"))
    assert result.status == "failed" and result.failure_code == "balance_insufficient"
    assert stub.requests[2]["path"] == f"/v1/transfers/{TRANSFER['id']}/reversals"
    assert stub.requests[2]["headers"]["Idempotency-Key"] == f"po_abc:reversal:{TRANSFER['id']}"  # as payout_return would reverse it


def test_a_payout_stripe_refuses_whose_transfer_it_will_not_reverse_is_no_refusal(stub: Stub) -> None:
    """The payout refused on the connected account, then its transfer's reversal refused: the
    money is on the connected account. Not a GatewayRejected (which the saga reads as nothing
    sent, and gives the merchant its money back): GatewayReturnRefused, for an operator."""
    refused = {"error": {"type": "invalid_request_error", "code": "balance_insufficient", "message": "Insufficient funds"}}
    no_reversal = {"error": {"type": "invalid_request_error", "code": "insufficient_funds",
                             "message": "Insufficient funds in the connected account to reverse this transfer."}}
    stub.script = [(200, TRANSFER), (400, refused), (400, no_reversal)]
    with pytest.raises(GatewayReturnRefused) as stuck:
        gateway(stub).payout_create(payout_request("po_abc"))
    assert not isinstance(stuck.value, GatewayRejected) and stuck.value.failure_code == "balance_insufficient"
    assert TRANSFER["id"] in str(stuck.value)


def test_a_5xx_on_either_leg_is_unknown(stub: Stub) -> None:
    stub.script = [(500, API_ERROR)]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).payout_create(payout_request("po_x"))
    stub.script = [(200, TRANSFER), (500, API_ERROR)]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).payout_create(payout_request("po_x"))


def test_payouts_of_reads_the_connected_accounts_payouts(stub: Stub) -> None:
    stub.script = [(200, {"object": "list", "data": [stripe_payout(status="paid"), stripe_payout(reference="po_other")], "has_more": False,
                          "url": "/v1/payouts"})]
    [found] = gateway(stub).payouts_of(reference="po_abc", destination="acct_1/ba_1")
    assert found.status == "paid" and stub.requests[0]["headers"]["Stripe-Account"] == "acct_1"
    # No payout, but a transfer that was not reversed: the outcome is not known.
    stub.script = [(200, {"object": "list", "data": [], "has_more": False, "url": "/v1/payouts"}),
                   (200, {"object": "list", "data": [TRANSFER], "has_more": False, "url": "/v1/transfers"})]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).payouts_of(reference="po_abc", destination="acct_1/ba_1")


def test_a_payout_event_names_our_payout() -> None:
    body = json.dumps({"id": "evt_1", "object": "event", "type": "payout.failed", "account": "acct_1",
                       "data": {"object": stripe_payout(status="failed", failure_code="account_closed")}}).encode()
    event = StripeGateway(api_base="http://127.0.0.1:9", secret_key="sk_test_x", timeout=1).event_parse(body)
    assert (event.kind, event.reference, event.failure_code, event.amount) == ("payout_failed", "po_abc", "account_closed", 5000)


def test_the_settlement_report_counts_a_payouts_transfer(stub: Stub) -> None:
    txn = {"id": "txn_9", "object": "balance_transaction", "amount": -5000, "currency": "jpy", "created": NOW, "type": "transfer",
           "source": TRANSFER}
    stub.script = [(200, {"object": "list", "data": [txn], "has_more": False, "url": "/v1/balance_transactions"})]
    report = gateway(stub).settlement_report(day=datetime.now(UTC).date())
    assert [(line.kind, line.amount, line.reference) for line in report.lines] == [("payout", -5000, "po_abc")]


def _list(data: list[dict[str, Any]], url: str, *, has_more: bool = False) -> dict[str, Any]:
    return {"object": "list", "data": data, "has_more": has_more, "url": url}


def test_payouts_of_pages_past_the_first_100_to_find_an_old_payout(stub: Stub) -> None:
    """The connected account's payouts newest first, 100 a page: ours is on the second."""
    others = [stripe_payout(reference=f"po_other{i}", id=f"po_{i:04d}") for i in range(100)]
    stub.script = [(200, _list(others, "/v1/payouts", has_more=True)), (200, _list([stripe_payout(status="paid")], "/v1/payouts"))]
    since = datetime.fromtimestamp(NOW, UTC)
    [found] = gateway(stub).payouts_of(reference="po_abc", destination="acct_1/ba_1", since=since)
    assert found.status == "paid" and found.psp_reference == "po_1OaFDbEcg9tTZuTgNYmX0PKB"
    first, second = stub.requests
    assert "starting_after" not in first["path"] and f"created[gte]={NOW - 3600}" in first["path"].replace("%5B", "[").replace("%5D", "]")
    assert "starting_after=po_0099" in second["path"]
    assert second["headers"]["Stripe-Account"] == "acct_1"  # the next page is the connected account's too


def test_payouts_of_a_known_payout_retrieves_it_by_its_id(stub: Stub) -> None:
    stub.script = [(200, stripe_payout(status="failed", failure_code="account_closed"))]
    [found] = gateway(stub).payouts_of(reference="po_abc", destination="acct_1/ba_1", psp_reference="po_1OaFDbEcg9tTZuTgNYmX0PKB")
    assert found.status == "failed" and found.failure_code == "account_closed"
    assert stub.requests[0]["path"] == "/v1/payouts/po_1OaFDbEcg9tTZuTgNYmX0PKB" and stub.requests[0]["headers"]["Stripe-Account"] == "acct_1"
    stub.script = [(200, stripe_payout(reference="po_someone_else"))]
    assert gateway(stub).payouts_of(reference="po_abc", destination="acct_1/ba_1", psp_reference="po_1OaFDbEcg9tTZuTgNYmX0PKB") == []


def test_a_canceled_payout_is_a_failure() -> None:
    body = json.dumps({"id": "evt_2", "object": "event", "type": "payout.canceled", "account": "acct_1",
                       "data": {"object": stripe_payout(status="canceled")}}).encode()
    event = StripeGateway(api_base="http://127.0.0.1:9", secret_key="sk_test_x", timeout=1).event_parse(body)
    assert (event.kind, event.reference, event.failure_code) == ("payout_failed", "po_abc", "canceled")


REVERSAL = {"id": "trr_1", "object": "transfer_reversal", "amount": 5000, "currency": "jpy", "transfer": TRANSFER["id"]}


def test_a_payout_failed_later_has_its_transfer_reversed_under_our_key(stub: Stub) -> None:
    stub.script = [(200, _list([TRANSFER], "/v1/transfers")), (200, REVERSAL)]
    gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    listed, reversed_ = stub.requests
    assert listed["path"].startswith("/v1/transfers?") and "transfer_group=po_abc" in listed["path"]
    assert reversed_["method"] == "POST" and reversed_["path"] == f"/v1/transfers/{TRANSFER['id']}/reversals"
    assert reversed_["headers"]["Idempotency-Key"] == f"po_abc:reversal:{TRANSFER['id']}"
    assert "Stripe-Account" not in reversed_["headers"]  # the platform's


def test_each_transfers_reversal_key_is_its_own_whatever_the_listing_order(stub: Stub) -> None:
    """Two transfers under one payout (something went wrong): each reversal's key is made of its
    transfer's id, so a retry that lists them in another order asks for each under its first key."""
    second = {**TRANSFER, "id": "tr_2", "amount": 100}
    stub.script = [(200, _list([TRANSFER, second], "/v1/transfers")), (200, REVERSAL), (200, {**REVERSAL, "id": "trr_2", "transfer": "tr_2"})]
    gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    first_round = {r["path"]: r["headers"]["Idempotency-Key"] for r in stub.requests[1:]}
    stub.requests.clear()
    stub.script = [(200, _list([second, TRANSFER], "/v1/transfers")), (200, {**REVERSAL, "id": "trr_2", "transfer": "tr_2"}), (200, REVERSAL)]
    gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    assert {r["path"]: r["headers"]["Idempotency-Key"] for r in stub.requests[1:]} == first_round == {
        f"/v1/transfers/{TRANSFER['id']}/reversals": f"po_abc:reversal:{TRANSFER['id']}", "/v1/transfers/tr_2/reversals": "po_abc:reversal:tr_2",
    }


def test_a_transfer_reversed_already_is_not_reversed_again(stub: Stub) -> None:
    stub.script = [(200, _list([{**TRANSFER, "reversed": True, "amount_reversed": 5000}], "/v1/transfers"))]
    gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    assert len(stub.requests) == 1


def test_a_reversal_stripe_refuses_is_a_rejection_and_no_answer_is_unknown(stub: Stub) -> None:
    refused = {"error": {"type": "invalid_request_error", "code": "insufficient_funds",
                         "message": "Insufficient funds in the connected account to reverse this transfer."}}
    stub.script = [(200, _list([TRANSFER], "/v1/transfers")), (400, refused)]
    with pytest.raises(GatewayRejected) as refusal:
        gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    assert refusal.value.code == "insufficient_funds"
    stub.script = [(200, _list([TRANSFER], "/v1/transfers")), (500, API_ERROR)]
    with pytest.raises(GatewayUnavailable):
        gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    stub.script = [(200, _list([], "/v1/transfers"))]  # no transfer: no money of it reached the account, nothing to take back
    gateway(stub).payout_return(reference="po_abc", psp_reference="po_1", destination="acct_1/ba_1", idempotency_key="po_abc:reversal")
    assert len(stub.requests) == 5  # the list alone


def test_the_settlement_report_nets_reversed_transfers_out(stub: Stub) -> None:
    """A payout failed later whose transfer was reversed left nothing: no payout line (no
    `payout_returned_but_sent` alarm); a partly reversed one counts what is left."""
    reversed_in_full = {"id": "txn_8", "object": "balance_transaction", "amount": -5000, "currency": "jpy", "created": NOW, "type": "transfer",
                        "source": {**TRANSFER, "reversed": True, "amount_reversed": 5000}}
    partly = {**reversed_in_full, "id": "txn_9", "source": {**TRANSFER, "id": "tr_2", "amount_reversed": 2000,
                                                                    "metadata": {"tally_payout": "po_def"}}}
    reversal = {"id": "txn_10", "object": "balance_transaction", "amount": 5000, "currency": "jpy", "created": NOW, "type": "transfer_refund",
                "source": REVERSAL}
    stub.script = [(200, _list([reversed_in_full, partly, reversal], "/v1/balance_transactions"))]
    report = gateway(stub).settlement_report(day=datetime.now(UTC).date())
    assert [(line.kind, line.amount, line.reference) for line in report.lines] == [("payout", -3000, "po_def")]


def test_the_connected_accounts_balance_is_read_on_that_account(stub: Stub) -> None:
    stub.script = [(200, {"object": "balance", "livemode": False,
                          "available": [{"amount": 3000, "currency": "jpy", "source_types": {"card": 3000}}],
                          "pending": [{"amount": 200, "currency": "jpy"}, {"amount": 0, "currency": "usd"}]})]
    assert gateway(stub).destination_balance(destination="acct_1/ba_1") == {"JPY": 3200, "USD": 0}
    assert stub.requests[0]["path"] == "/v1/balance" and stub.requests[0]["headers"]["Stripe-Account"] == "acct_1"


def test_a_stripe_payout_failed_after_paid_has_its_transfer_reversed_before_the_merchant_gets_the_money(live_tenant: Tenant, stub: Stub) -> None:
    """End to end through the saga: paid, then `payout.failed` days later. The money is on the
    connected account, so the merchant is credited only once the transfer is reversed under
    `<payout id>:reversal`; Stripe not answering leaves the payout owed, and the retry gives it back once."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.models import GatewayAccount, MerchantBankAccount, Payout
    from payments.services.payout_saga import payout_return
    from payments.services.payouts import bank_account_attach, payout_create
    from tests.payouts_support import balance, fund
    from wallets.services.principals import merchant_create, staff_member_get_or_create

    gateway_account_set(gateway="stripe", api_base=stub.url, secret_key="sk_test_x", webhook_secrets=["whsec_x"])
    try:
        merchant = merchant_create(name=f"Connect {uuid.uuid4().hex[:6]}")
        fund(merchant, 5_000, days_ago=3)
        stub.script = [(200, {"id": "acct_1", "object": "account", "type": "custom", "metadata": {"tally_merchant": merchant.pk},
                              "external_accounts": {"object": "list", "data": [{"id": "ba_1", "object": "bank_account", "last4": "6789"}]}})]
        bank_account_attach(merchant=merchant, token="btok_1", staff=staff_member_get_or_create(username=f"ops-{uuid.uuid4().hex[:6]}"))
        MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=8))
        psp_payout_id = f"po_{uuid.uuid4().hex[:24]}"
        stub.script = [(200, TRANSFER), (200, stripe_payout(id=psp_payout_id))]
        payout = payout_create(merchant=merchant, asset_code="JPY", amount=5_000)  # sent after its commit
        assert Payout.objects.get(pk=payout.pk).status == "in_transit" and balance(merchant) == 0
        client = Client(HTTP_HOST=TENANT_A["domain"])

        def event(kind: str, **extra: Any) -> Any:
            body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "object": "event", "type": kind, "account": "acct_1",
                               "data": {"object": stripe_payout(id=psp_payout_id, reference=payout.pk, **extra)}}).encode()
            ts = int(time.time())
            return client.post("/v1/psp/webhooks/stripe", data=body, content_type="application/json",
                               HTTP_STRIPE_SIGNATURE=f"t={ts},v1={signature_compute(secret='whsec_x', body=body, timestamp=ts)}")

        assert event("payout.paid", status="paid").json()["outcome"] == "applied"
        assert Payout.objects.get(pk=payout.pk).status == "paid"
        stub.requests.clear()
        stub.script = [(500, API_ERROR)]  # the transfers' list, after the webhook's commit: no answer
        assert event("payout.failed", status="failed", failure_code="account_closed").json()["outcome"] == "applied"
        owed = Payout.objects.get(pk=payout.pk)
        assert owed.status == "paid" and owed.return_owed_at is not None and balance(merchant) == 0  # nothing back before the reversal
        ours = {**TRANSFER, "transfer_group": payout.pk, "metadata": {"tally_payout": payout.pk}}
        stub.script = [(200, _list([ours], "/v1/transfers")), (200, REVERSAL)]
        assert payout_return(payout_id=payout.pk) == "failed"  # the recovery's retry
        returned = Payout.objects.get(pk=payout.pk)
        assert returned.status == "failed" and returned.failure_code == "account_closed" and returned.return_owed_at is None
        assert balance(merchant) == 5_000
        reversal = stub.requests[-1]
        assert reversal["path"] == f"/v1/transfers/{TRANSFER['id']}/reversals"
        assert reversal["headers"]["Idempotency-Key"] == f"{payout.pk}:reversal:{TRANSFER['id']}"
        assert payout_return(payout_id=payout.pk) == "unchanged" and balance(merchant) == 5_000  # once
    finally:
        GatewayAccount.objects.filter(gateway="stripe").delete()


def test_a_stripe_payout_refused_with_its_transfer_stuck_stops_for_an_operator_and_is_failed_only_through_a_reversal(
    live_tenant: Tenant, stub: Stub
) -> None:
    """Stripe refuses the payout on the connected account, then the reversal of its transfer:
    the money is there, so the merchant is not credited and the payout stops in the operator
    queue. Two staff members failing it make Tally reverse the transfer first, under the key
    the refused payout's reversal had; the merchant gets the money once Stripe gave it back."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.models import GatewayAccount, MerchantBankAccount, Payout
    from payments.services.payouts import bank_account_attach, payout_create, payout_review_resolve
    from tests.payouts_support import balance, fund
    from wallets.services.principals import merchant_create, staff_member_get_or_create

    gateway_account_set(gateway="stripe", api_base=stub.url, secret_key="sk_test_x", webhook_secrets=["whsec_x"])
    try:
        merchant = merchant_create(name=f"Connect {uuid.uuid4().hex[:6]}")
        fund(merchant, 5_000, days_ago=3)
        stub.script = [(200, {"id": "acct_1", "object": "account", "type": "custom", "metadata": {"tally_merchant": merchant.pk},
                              "external_accounts": {"object": "list", "data": [{"id": "ba_1", "object": "bank_account", "last4": "6789"}]}})]
        alice, bob = (staff_member_get_or_create(username=f"ops-{uuid.uuid4().hex[:6]}") for _ in range(2))
        bank_account_attach(merchant=merchant, token="btok_1", staff=alice)
        MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=8))
        refused = {"error": {"type": "invalid_request_error", "code": "balance_insufficient", "message": "Insufficient funds"}}
        no_reversal = {"error": {"type": "invalid_request_error", "code": "insufficient_funds", "message": "Insufficient funds"}}
        stub.script = [(200, TRANSFER), (400, refused), (400, no_reversal)]
        payout = payout_create(merchant=merchant, asset_code="JPY", amount=5_000)  # sent after its commit
        stuck = Payout.objects.get(pk=payout.pk)
        assert stuck.status == "pending" and stuck.review_at is not None and "neither sent nor back" in stuck.review_reason
        assert balance(merchant) == 0 and stuck.returned_transaction_id is None  # the transfer is on the connected account
        assert stuck.return_failure_code == "balance_insufficient"

        payout_review_resolve(payout=payout, staff=alice, outcome="failed", reason="Stripe shows the transfer on the account")
        ours = {**TRANSFER, "transfer_group": payout.pk, "metadata": {"tally_payout": payout.pk}}
        stub.requests.clear()
        stub.script = [(200, _list([ours], "/v1/transfers")), (200, REVERSAL)]
        payout_review_resolve(payout=payout, staff=bob, outcome="failed", reason="agreed")  # the reversal after its commit
        failed = Payout.objects.get(pk=payout.pk)
        assert failed.status == "failed" and failed.failure_code == "balance_insufficient" and failed.review_at is None
        assert failed.return_owed_at is None and balance(merchant) == 5_000
        assert stub.requests[-1]["headers"]["Idempotency-Key"] == f"{payout.pk}:reversal:{TRANSFER['id']}"
    finally:
        GatewayAccount.objects.filter(gateway="stripe").delete()
