"""Inbound PSP webhooks (SPEC 8) in process: signature and timestamp checks (tampered,
stale, unsigned, wrong secret refused with nothing applied; any of several secrets
accepted), the event id recorded with its effect (a redelivery is a no-op; a failing
handler records nothing, so the retry is processed), unknown types acknowledged. And the
tenant's gateway credentials sealed at rest."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from django.db import connection
from django.test import Client

from payments.gateways import metrics
from payments.gateways.credentials import credential_unseal
from payments.gateways.registry import gateway_secret_key, gateway_webhook_secrets
from payments.gateways.signing import TOLERANCE_SECONDS, signature_compute
from payments.models import GatewayAccount, PspWebhookEvent, TopUp
from payments.services import psp_webhooks
from payments.services.topups import gateway_account_set, topup_pending_ensure
from tenants.models import Tenant
from tests.conftest import TENANT_A, psp_account_configure
from tests.factories import CustomerFactory
from wallets.models import Account, LedgerTransaction
from wallets.selectors import account_balance

URL = "/v1/psp/webhooks/simulator"
SECRETS = ["whsec_old", "whsec_new"]


@pytest.fixture
def pending(tenant: Tenant) -> TopUp:
    gateway_account_set(gateway="simulator", api_base="http://127.0.0.1:9", secret_key="sk_sim_x", webhook_secrets=SECRETS)
    customer = CustomerFactory()
    return topup_pending_ensure(
        topup_id=f"top_{uuid.uuid4().hex[:20]}", customer=customer, asset_code="JPY", amount=1000, payment_method="pm_card_visa",
        claim_principal_id=customer.pk, claim_key="k",
    )


def event(topup: TopUp, kind: str = "charge.succeeded", **overrides: Any) -> bytes:
    charge = {
        "id": f"ch_{uuid.uuid4().hex[:12]}", "object": "charge", "amount": topup.amount, "currency": "jpy",
        "status": "succeeded" if kind == "charge.succeeded" else "failed",
        "failure_code": "" if kind == "charge.succeeded" else "card_declined", "metadata": {"tally_topup": topup.pk},
        "created": int(time.time()),
    }
    body = {"id": f"evt_{uuid.uuid4().hex[:16]}", "object": "event", "type": kind, "created": int(time.time()), "data": {"object": charge}}
    body.update(overrides)
    return json.dumps(body).encode()


def send(body: bytes, *, secret: str | None = "whsec_new", timestamp: int | None = None, header: str | None = None) -> Any:
    client = Client(HTTP_HOST=TENANT_A["domain"])
    extra: dict[str, str] = {}
    if header is not None:
        extra["HTTP_PSP_SIGNATURE"] = header
    elif secret is not None:
        ts = int(time.time()) if timestamp is None else timestamp
        extra["HTTP_PSP_SIGNATURE"] = f"t={ts},v1={signature_compute(secret=secret, body=body, timestamp=ts)}"
    return client.post(URL, data=body, content_type="application/json", **extra)


def credited(topup: TopUp) -> int:
    return LedgerTransaction.objects.filter(kind="topup", reference=topup.pk).count()


def test_a_signed_event_credits_once_and_its_redelivery_is_a_no_op(pending: TopUp) -> None:
    body = event(pending)
    first = send(body)
    assert first.status_code == 200 and first.json() == {"received": True, "outcome": "applied"}
    pending.refresh_from_db()
    assert pending.status == "succeeded" and credited(pending) == 1
    assert account_balance(account=Account.objects.get(customer_id=pending.customer_id), asset_code="JPY")[0] == 1000
    again = send(body)
    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    another_event_same_charge = send(event(pending))  # the PSP's second event about it: settled already
    assert another_event_same_charge.status_code == 200 and credited(pending) == 1
    assert PspWebhookEvent.objects.filter(event_id=json.loads(body)["id"]).count() == 1


def test_either_rotation_secret_is_accepted(pending: TopUp) -> None:
    assert send(event(pending, kind="charge.failed"), secret="whsec_old").status_code == 200
    pending.refresh_from_db()
    assert pending.status == "failed" and pending.failure_code == "card_declined"


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("tampered", "signature_invalid"),
        ("wrong_secret", "signature_invalid"),
        ("unsigned", "signature_invalid"),
        ("malformed", "signature_invalid"),
        ("stale", "signature_timestamp_out_of_tolerance"),
        ("future", "signature_timestamp_out_of_tolerance"),
    ],
)
def test_bad_signatures_are_refused_with_nothing_applied(pending: TopUp, case: str, code: str) -> None:
    body = event(pending)
    now = int(time.time())
    if case == "tampered":
        header = f"t={now},v1={signature_compute(secret='whsec_new', body=body, timestamp=now)}"
        response = send(body.replace(b'"amount": 1000', b'"amount": 9000'), header=header)
    elif case == "wrong_secret":
        response = send(body, secret="whsec_someone_else")
    elif case == "unsigned":
        response = send(body, secret=None)
    elif case == "malformed":
        response = send(body, header="v1=deadbeef")
    elif case == "stale":
        response = send(body, timestamp=now - TOLERANCE_SECONDS - 60)
    else:
        # A wide margin: the server's clock reads later than `now`, so `now + 301` can be
        # inside the window by the time it is checked. The exact edge is pinned in
        # test_signature_tolerance_edge with a fixed clock.
        response = send(body, timestamp=now + TOLERANCE_SECONDS + 60)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["request_id"].startswith("req_")
    pending.refresh_from_db()
    assert pending.status == "pending" and credited(pending) == 0 and not PspWebhookEvent.objects.exists()


def test_unknown_event_types_are_acknowledged_and_logged(pending: TopUp, caplog: Any) -> None:
    response = send(event(pending, kind="charge.dispute.created"))
    assert response.status_code == 200 and response.json()["outcome"] == "ignored"
    assert any("without effect" in r.message for r in caplog.records)
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_failing_handler_records_nothing_and_the_retry_is_processed(pending: TopUp, monkeypatch: Any) -> None:
    body = event(pending)
    real = psp_webhooks.topup_settle
    calls = {"n": 0}

    def flaky(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("handler crashed")
        return real(**kwargs)

    monkeypatch.setattr(psp_webhooks, "topup_settle", flaky)
    failed = send(body)
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "unavailable"
    assert not PspWebhookEvent.objects.exists()  # no marker: the provider's retry is not a "duplicate"
    retried = send(body)
    assert retried.status_code == 200 and retried.json()["outcome"] == "applied"
    pending.refresh_from_db()
    assert pending.status == "succeeded" and credited(pending) == 1


@pytest.mark.parametrize("field", ["amount", "currency"])
def test_a_charge_whose_amount_or_currency_differs_is_never_credited_and_waits_for_an_operator(pending: TopUp, field: str) -> None:
    """The event is authentic (signed by the top-up's gateway) but its charge is not the
    top-up's: acknowledged (a 4xx would be retried for days with nothing to gain), nothing
    credited, the top-up in the operator queue with the PSP's figures, the event recorded."""
    body = json.loads(event(pending))
    body["data"]["object"][field] = 999_999 if field == "amount" else "eur"
    response = send(json.dumps(body).encode())
    assert response.status_code == 200 and response.json()["outcome"] == "mismatch", response.content
    pending.refresh_from_db()
    assert pending.status == "pending" and credited(pending) == 0 and not pending.psp_charged
    assert pending.operator_review_at is not None and "not the top-up's" in pending.last_error
    assert PspWebhookEvent.objects.get(event_id=body["id"]).outcome == "mismatch"
    assert send(json.dumps(body).encode()).json()["outcome"] == "duplicate"


def _charge_at_simulator(sim: Any, psp_key: str, topup: TopUp, *, amount: int, currency: str = "JPY") -> Any:
    """A real charge at the PSP simulator under the top-up's id (its metadata)."""
    from payments.gateways.base import ChargeRequest
    from payments.gateways.simulator import SimulatorGateway

    return SimulatorGateway(api_base=sim.url, secret_key=psp_key, timeout=5.0).charge(
        ChargeRequest(amount=amount, currency=currency, payment_method="pm_card_visa", idempotency_key=topup.pk, reference=topup.pk)
    )


def _event_of(topup: TopUp, charge: Any) -> bytes:
    body = json.loads(event(topup))
    body["data"]["object"].update(id=charge.psp_reference, amount=charge.amount, currency=charge.currency.lower())
    return json.dumps(body).encode()


@pytest.mark.parametrize("failure_code", ["request_invalid", "psp_refused", "wallet_frozen"])
def test_a_late_charge_of_another_amount_on_a_failed_top_up_is_refunded_exactly(
    pending: TopUp, psp_simulator: Any, failure_code: str
) -> None:
    """A top-up failed before its charge was known (its claim abandoned, the PSP refusing a
    retry, a frozen wallet), then the PSP's event of a successful charge of ANOTHER amount
    under its id. Nothing is credited; the charge is recorded with the PSP's own amount and
    currency and the card gets back exactly that. It used to be acknowledged as `mismatch`
    and left: the card charged, never refunded, in no queue and no reconciliation list."""
    from payments.selectors import topups_charged_uncredited
    from payments.services.refunds import topup_refunds_run

    psp_key = psp_account_configure(psp_simulator, webhook_secrets=SECRETS)
    TopUp.objects.filter(pk=pending.pk).update(status="failed", failure_code=failure_code)
    charge = _charge_at_simulator(psp_simulator, psp_key, pending, amount=1500)
    response = send(_event_of(pending, charge))
    assert response.status_code == 200 and response.json()["outcome"] == "applied", response.content
    pending.refresh_from_db()
    assert pending.status == "failed" and pending.psp_charged and pending.psp_reference == charge.psp_reference
    assert (pending.psp_charged_amount, pending.psp_charged_currency) == (1500, "JPY") and credited(pending) == 0
    assert topups_charged_uncredited().filter(pk=pending.pk).exists()
    assert topup_refunds_run()["refunded"] == 1
    assert topup_refunds_run().get("refunded", 0) == 0
    refunds = psp_simulator.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(charge.psp_reference, 1500)]


def test_a_charge_already_recorded_on_another_top_up_is_never_recorded_twice(pending: TopUp) -> None:
    """The event names a failed top-up but carries a charge recorded on another one: it is
    acknowledged as `mismatch`, and neither top-up changes (the reference is one top-up's)."""
    customer = CustomerFactory()
    other = topup_pending_ensure(
        topup_id=f"top_{uuid.uuid4().hex[:20]}", customer=customer, asset_code="JPY", amount=1000, payment_method="pm_card_visa",
        claim_principal_id=customer.pk, claim_key="k3",
    )
    TopUp.objects.filter(pk=other.pk).update(psp_reference="ch_taken", psp_charged=True, status="failed", failure_code="cap_exceeded")
    TopUp.objects.filter(pk=pending.pk).update(status="failed", failure_code="request_invalid")
    body = json.loads(event(pending))
    body["data"]["object"].update(id="ch_taken", amount=777)
    response = send(json.dumps(body).encode())
    assert response.status_code == 200 and response.json()["outcome"] == "mismatch"
    pending.refresh_from_db()
    assert not pending.psp_charged and pending.psp_reference == ""


def test_an_event_signed_for_another_gateway_never_settles_the_top_up(pending: TopUp, caplog: Any) -> None:
    """The tenant's Stripe top-up, and a correctly signed event from its simulator account
    (whose secret sits in var/ on a development box) naming that top-up: acknowledged,
    recorded and logged as `wrong_gateway`, and the top-up is left as it was. It used to be
    credited, and a charge.failed one failed it."""
    gateway_account_set(gateway="stripe", api_base="http://127.0.0.1:9", secret_key="sk_test_x", webhook_secrets=["whsec_stripe"])
    customer = CustomerFactory()
    stripe_topup = topup_pending_ensure(
        topup_id=f"top_{uuid.uuid4().hex[:20]}", customer=customer, asset_code="JPY", amount=1000, payment_method="pm_card_visa",
        claim_principal_id=customer.pk, claim_key="k2",
    )
    assert stripe_topup.gateway == "stripe"
    for kind in ("charge.succeeded", "charge.failed"):
        body = event(stripe_topup, kind=kind)
        response = send(body)  # the simulator's endpoint, the simulator's secret: a valid signature
        assert response.status_code == 200 and response.json()["outcome"] == "wrong_gateway", response.content
        assert PspWebhookEvent.objects.get(event_id=json.loads(body)["id"]).outcome == "wrong_gateway"
    stripe_topup.refresh_from_db()
    assert stripe_topup.status == "pending" and credited(stripe_topup) == 0 and stripe_topup.psp_reference == ""
    assert any("another gateway" in r.message for r in caplog.records)
    assert send(event(pending)).json()["outcome"] == "applied"  # the simulator's own top-up: applied as ever


def test_unknown_gateway_and_unconfigured_gateway_are_404(tenant: Tenant) -> None:
    client = Client(HTTP_HOST=TENANT_A["domain"])
    assert client.post("/v1/psp/webhooks/paypal", data=b"{}", content_type="application/json").status_code == 404
    assert client.post("/v1/psp/webhooks/stripe", data=b"{}", content_type="application/json").status_code == 404


def test_webhook_outcomes_are_counted(pending: TopUp) -> None:
    def sample(outcome: str) -> float:
        return sum(s.value for m in metrics.PSP_WEBHOOKS.collect() for s in m.samples
                   if s.name.endswith("_total") and s.labels.get("outcome") == outcome)

    before = sample("refused_signature"), sample("applied")
    send(event(pending), secret="nope")
    send(event(pending))
    assert (sample("refused_signature"), sample("applied")) == (before[0] + 1, before[1] + 1)


def test_gateway_credentials_are_sealed_at_rest(tenant: Tenant) -> None:
    gateway_account_set(gateway="simulator", api_base="http://127.0.0.1:9", secret_key="sk_sim_secret_value", webhook_secrets=SECRETS)
    account = GatewayAccount.objects.get(gateway="simulator")
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret_key_sealed, webhook_secrets_sealed FROM payments_gatewayaccount WHERE id = %s", [account.pk])
        raw_key, raw_secrets = (bytes(v) for v in cursor.fetchone())
    assert b"sk_sim_secret_value" not in raw_key and b"whsec" not in raw_secrets
    assert gateway_secret_key(account=account) == "sk_sim_secret_value" and gateway_webhook_secrets(account=account) == SECRETS
    # Bound to its tenant, gateway and field: copied elsewhere it does not open.
    with pytest.raises(InvalidTag):
        credential_unseal(sealed=raw_key, schema="test_b", gateway="simulator", field="secret_key")
    with pytest.raises(InvalidTag):
        credential_unseal(sealed=raw_key, schema=TENANT_A["schema_name"], gateway="simulator", field="webhook_secrets")


def test_the_operator_chooses_the_gateway_with_secrets_from_the_environment(tenant: Tenant, monkeypatch: Any) -> None:
    from django.core.management import CommandError, call_command

    monkeypatch.setenv("TALLY_PSP_SECRET_KEY", "sk_test_from_env")
    monkeypatch.setenv("TALLY_PSP_WEBHOOK_SECRETS", "whsec_a, whsec_b")
    call_command("gateway_account_set", "--schema", tenant.schema_name, "--gateway", "stripe")
    connection.set_tenant(tenant)
    account = GatewayAccount.objects.get(active=True)
    assert account.gateway == "stripe" and account.api_base == "https://api.stripe.com"
    assert gateway_secret_key(account=account) == "sk_test_from_env" and gateway_webhook_secrets(account=account) == ["whsec_a", "whsec_b"]
    monkeypatch.setenv("TALLY_PSP_WEBHOOK_SECRETS", "")
    with pytest.raises(CommandError, match="webhook secret"):
        call_command("gateway_account_set", "--schema", tenant.schema_name, "--gateway", "stripe")


def test_event_markers_are_kept_30_days_then_purged(pending: TopUp) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from payments.services.psp_webhooks import psp_webhook_events_purge

    body = event(pending)
    assert send(body).json()["outcome"] == "applied"
    assert psp_webhook_events_purge() == 0
    PspWebhookEvent.objects.update(received=timezone.now() - timedelta(days=31))
    assert psp_webhook_events_purge(batch_size=1) == 1 and not PspWebhookEvent.objects.exists()


def test_one_purge_deletes_a_bounded_number_of_batches(pending: TopUp) -> None:
    """A backlog of expired markers is worked off over runs: one purge stops after its
    batches, so the recovery pass it ends never outlasts its time limit for it. The loop
    used to run until the backlog was gone."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.services.psp_webhooks import psp_webhook_events_purge

    PspWebhookEvent.objects.bulk_create(
        PspWebhookEvent(gateway="simulator", event_id=f"evt_old_{n}", type="charge.succeeded", outcome="applied") for n in range(5)
    )
    PspWebhookEvent.objects.update(received=timezone.now() - timedelta(days=31))
    assert psp_webhook_events_purge(batch_size=2, max_batches=2) == 4
    assert PspWebhookEvent.objects.count() == 1
    assert psp_webhook_events_purge(batch_size=2, max_batches=2) == 1 and not PspWebhookEvent.objects.exists()


def test_a_charged_currency_as_long_as_an_asset_code_is_recorded_whole(pending: TopUp) -> None:
    """Asset codes run to 12 characters; the charged currency column was 10 (and the value
    cut to 10): the refund's record of what was charged lost its currency's tail."""
    from django.db import transaction
    from django.utils import timezone

    from payments.gateways.base import ChargeResult
    from payments.services.topups import topup_settle

    TopUp.objects.filter(pk=pending.pk).update(status="failed", failure_code="request_invalid")
    charge = ChargeResult(status="succeeded", psp_reference=f"ch_{uuid.uuid4().hex[:12]}", amount=1000, currency="regional_12c",
                          failure_code="", created=timezone.now())
    with transaction.atomic():
        topup_settle(topup_id=pending.pk, result=charge)
    pending.refresh_from_db()
    assert pending.psp_charged and pending.psp_charged_currency == "REGIONAL_12C"

