"""Sealing keys of their own (wallets/sealing.py): a ring in TALLY_SEALING_KEYS, never
derived from SECRET_KEY. A key is rotated online (add the new key first, `secrets_reseal`,
remove the old one) with every PSP call, webhook delivery and stored replay still working;
a database from an older release upgrades only through the explicit legacy key; a missing
or malformed ring is a system check error; the reseal is batched, resumable and reaches a
switched-off tenant."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import Client
from django_tenants.utils import schema_context

from idempotency.staff import staff_action_run
from payments.gateways.credentials import SCHEME as CREDENTIALS
from payments.gateways.credentials import credential_aad
from payments.gateways.registry import gateway_secret_key, gateway_webhook_secrets
from payments.models import GatewayAccount, TopUp
from payments.services.outbox import outbox_event_create
from tenants.models import Tenant
from tests.conftest import TENANT_A, psp_account_configure
from tests.factories import MerchantFactory
from tests.psp_sim import Simulator
from tests.receivers import doc_receiver, receiver_running
from tests.staged_support import scratch_tenants
from wallets import sealing
from wallets.checks import sealing_ring_check
from wallets.models import Account
from wallets.sealing import SealingKeyUnknown, SealingRingInvalid, sealing_ring_forget
from wallets.selectors import account_balance
from wallets.services.principals import api_key_create, customer_create
from webhooks.models import WebhookEndpoint
from webhooks.secrets import SCHEME as WEBHOOK_SCHEME
from webhooks.secrets import webhook_endpoint_secrets
from webhooks.services.endpoints import webhook_endpoint_create
from webhooks.services.relay import outbox_relay_run

RX = doc_receiver()


def _key(key_id: str) -> str:
    return f"{key_id}:{base64.urlsafe_b64encode(os.urandom(32)).decode()}"


@pytest.fixture
def ring(settings: Any) -> Iterator[Any]:
    """Set the ring as a restarted process would see it (settings, and no parsed key kept)."""

    def use(*entries: str, legacy: str = "") -> None:
        settings.TALLY_SEALING_KEYS = list(entries)
        settings.TALLY_SEALING_LEGACY_SECRET_KEY = legacy
        sealing_ring_forget()

    use.suite = list(settings.TALLY_SEALING_KEYS)  # type: ignore[attr-defined]  # what other tests' committed rows are sealed under
    yield use
    sealing_ring_forget()


def _reseal(**options: Any) -> str:
    out = io.StringIO()
    call_command("secrets_reseal", stdout=out, **options)
    return out.getvalue()


def _key_ids_stored(merchant: Any = None) -> set[str]:
    """The key id of every sealed value in the current tenant's gateway accounts and
    endpoints (those of `merchant`, when given)."""
    ids: set[str] = set()
    for account in GatewayAccount.objects.filter(gateway="simulator"):
        for value in (account.secret_key_sealed, account.webhook_secrets_sealed):
            ids.add(sealing.secret_key_id(scheme=CREDENTIALS, stored=bytes(value)))
    endpoints = WebhookEndpoint.objects.filter(secret_sealed__isnull=False)
    if merchant is not None:
        endpoints = endpoints.filter(merchant=merchant)
    for current, previous in endpoints.values_list("secret_sealed", "previous_secret_sealed"):
        for value in (current, previous):
            if value is not None:
                ids.add(sealing.secret_key_id(scheme=WEBHOOK_SCHEME, stored=bytes(value)))
    return ids


def _old_release_seal(scheme: sealing.SealScheme, plaintext: bytes, aad: bytes, secret_key: str) -> bytes:
    """A value as releases before the ring sealed it: HMAC(SECRET_KEY, purpose), no key id."""
    key = hmac.new(secret_key.encode(), scheme.purpose, hashlib.sha256).digest()
    nonce = os.urandom(12)
    return scheme.tag + b":v1:" + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def _opens_with_secret_key_alone(scheme: sealing.SealScheme, stored: bytes, aad: bytes, secret_key: str) -> bool:
    """Whether the old derivation from SECRET_KEY opens `stored`, wherever its nonce is."""
    key = AESGCM(hmac.new(secret_key.encode(), scheme.purpose, hashlib.sha256).digest())
    for start in range(len(stored) - 12):
        try:
            key.decrypt(stored[start:start + 12], stored[start + 12:], aad)
            return True
        except InvalidTag:
            continue
    return False


def _topup(client: Client, key: str, amount: int) -> Any:
    body = json.dumps({"asset": "JPY", "amount": amount, "payment_method": "pm_card_visa"})
    return client.post("/v1/customer/topups", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}",
                       HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)


# --- Rotation ---------------------------------------------------------------------------------


def test_a_key_is_rotated_online_and_every_psp_call_delivery_and_replay_still_works(
    tenant: Tenant, psp_simulator: Simulator, loopback_http: None, ring: Any, settings: Any, monkeypatch: Any
) -> None:
    from payments.services import topups
    from payments.services.refunds import topup_refunds_run
    from wallets.models import Asset

    settings.TALLY_OUTBOX_RELAY_KICK = False
    key_a, key_b = _key("keyA"), _key("keyB")
    ring(key_a, *ring.suite)
    client = Client(HTTP_HOST=TENANT_A["domain"])
    psp_key = psp_account_configure(psp_simulator)
    merchant = MerchantFactory()
    customer = customer_create(name=f"Rotate {uuid.uuid4().hex[:6]}")
    customer_key = api_key_create(principal=customer)[1]
    token = client.post("/v1/customer/payment_tokens", data="{}", content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {customer_key}", HTTP_IDEMPOTENCY_KEY="token-1")
    assert token.status_code == 201, token.content
    replayed = client.post("/v1/customer/payment_tokens", data="{}", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {customer_key}", HTTP_IDEMPOTENCY_KEY="token-1")
    assert replayed.content == token.content  # now also in the Redis replay cache, sealed under A
    staff_key = f"staff-{uuid.uuid4().hex}"  # the Redis replay cache outlives the rolled-back test
    staff = staff_action_run(user_id=4242, action="reveal", target=merchant, idempotency_key=staff_key, data={},
                             fn=lambda: ("revealed", "sk_shown_once"), audit=False)
    assert staff.secret == "sk_shown_once"
    with receiver_running() as rx:
        endpoint, signing_secret = webhook_endpoint_create(merchant=merchant, url=rx.url(), enabled_events=["*"])
        assert _key_ids_stored(merchant) == {"keyA"}

        # The rotation: B first in every process, re-seal, then A is removed and processes
        # restart. (The suite's own key goes too: this tenant holds other tests' rows.)
        ring(key_b, key_a, *ring.suite)
        out = _reseal(tenant=tenant.schema_name)
        counts = dict(part.rsplit(" ", 1) for part in out.split(": re-sealed ", 1)[1].splitlines()[0].split(", "))
        assert counts["gateway_accounts"] == "1" and int(counts["idempotency_records"]) >= 2 and int(counts["webhook_endpoints"]) >= 1, out
        assert "under key 'keyB'" in out
        assert _key_ids_stored(merchant) == {"keyB"}
        assert "done: 0 rows re-sealed" in _reseal(tenant=tenant.schema_name)
        ring(key_b)

        # A webhook delivery, signed with the secret the merchant was given before the rotation.
        outbox_event_create(topic="payment.succeeded", payload={"id": "pay_rotate", "object": "payment", "merchant": merchant.pk, "amount": 1})
        outbox_relay_run()
        assert rx.requests, "nothing delivered"
        RX.verify(body=rx.requests[0].body, header=rx.requests[0].headers["Tally-Signature"], secrets=[signing_secret])
    assert webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=endpoint.pk)).current == signing_secret

    # A card top-up charge and, for one that can no longer be credited, its refund: both call the PSP.
    charged = _topup(client, customer_key, 1_000)
    assert charged.status_code == 201, charged.content
    assert account_balance(account=Account.objects.get(customer=customer), asset_code="JPY")[0] == 1_000
    Asset.objects.filter(code="JPY").update(cap=1_500)
    monkeypatch.setattr(topups, "topup_refusal_check", lambda **kwargs: None)
    refused = _topup(client, customer_key, 2_000)
    assert refused.status_code == 402 and refused.json()["error"]["code"] == "cap_exceeded"
    assert topup_refunds_run()["refunded"] == 1
    topup = TopUp.objects.get(customer=customer, amount=2_000)
    refunds = psp_simulator.state()["accounts"][psp_key]["refunds"]
    assert [(rf["charge"], rf["amount"]) for rf in refunds] == [(topup.psp_reference, 2_000)]
    assert gateway_webhook_secrets(account=GatewayAccount.objects.get(gateway="simulator")) == ["whsec_test_1"]

    # Stored replays: the API's sealed answer and a staff action's sealed secret.
    again = client.post("/v1/customer/payment_tokens", data="{}", content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {customer_key}", HTTP_IDEMPOTENCY_KEY="token-1")
    assert again["Idempotent-Replayed"] == "true" and again.content == token.content
    staff_again = staff_action_run(user_id=4242, action="reveal", target=merchant, idempotency_key=staff_key, data={},
                                   fn=lambda: ("never run", "never"), audit=False)
    assert staff_again.replayed and staff_again.secret == "sk_shown_once"

    # Nothing opens with SECRET_KEY alone: not the values stored now, not with no ring.
    account = GatewayAccount.objects.get(gateway="simulator")
    aad = credential_aad(connection.schema_name, "simulator", "secret_key")
    assert not _opens_with_secret_key_alone(CREDENTIALS, bytes(account.secret_key_sealed), aad, settings.SECRET_KEY)
    ring()
    with pytest.raises(SealingRingInvalid):
        gateway_secret_key(account=account)
    ring(_key("keyC"))
    with pytest.raises(SealingKeyUnknown):
        gateway_secret_key(account=account)


def test_an_old_release_database_opens_only_with_the_explicit_legacy_key_then_reseals(
    tenant: Tenant, psp_simulator: Simulator, ring: Any, settings: Any
) -> None:
    """Values sealed by a release before the ring (under SECRET_KEY) do not open with the
    ring alone, nor with SECRET_KEY set as Django's secret; with the old SECRET_KEY given as
    TALLY_SEALING_LEGACY_SECRET_KEY they open, `secrets_reseal` moves them to the ring, and
    the legacy key can go."""
    old_secret_key = "the-secret-key-of-the-old-release"
    settings.SECRET_KEY = old_secret_key  # even the very same SECRET_KEY opens nothing by itself
    key_b = _key("keyB")
    ring(key_b, *ring.suite)
    psp_key = psp_account_configure(psp_simulator)
    merchant = MerchantFactory()
    endpoint, signing_secret = webhook_endpoint_create(merchant=merchant, url="https://93.184.215.14/hook", enabled_events=["*"])
    schema = connection.schema_name
    GatewayAccount.objects.filter(gateway="simulator").update(
        secret_key_sealed=_old_release_seal(CREDENTIALS, psp_key.encode(), credential_aad(schema, "simulator", "secret_key"), old_secret_key),
    )
    aad = f"{schema}\x00webhook_endpoint\x00{endpoint.pk}\x00secret".encode()
    old_sealed = _old_release_seal(WEBHOOK_SCHEME, signing_secret.encode(), aad, old_secret_key)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret_sealed=old_sealed)
    account = GatewayAccount.objects.get(gateway="simulator")
    with pytest.raises(SealingKeyUnknown, match="TALLY_SEALING_LEGACY_SECRET_KEY"):
        gateway_secret_key(account=account)

    ring(key_b, *ring.suite, legacy=old_secret_key)
    assert gateway_secret_key(account=account) == psp_key
    assert _key_ids_stored(merchant) == {"legacy", "keyB"}
    _reseal(tenant=schema)
    assert _key_ids_stored(merchant) == {"keyB"}

    ring(key_b)  # the legacy key removed: everything opens from the ring
    assert gateway_secret_key(account=GatewayAccount.objects.get(gateway="simulator")) == psp_key
    assert webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=endpoint.pk)).current == signing_secret
    assert sealing_ring_check() == []


# --- The system check ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([], "TALLY_SEALING_KEYS is not set"),
        (["k1:" + base64.b64encode(b"short").decode()], "is 5 bytes, not 32"),
        (["k1:not base64!!"], "is not base64"),
        ([base64.b64encode(os.urandom(32)).decode()], "each entry is <id>:<base64 key>"),
        (["legacy:" + base64.b64encode(os.urandom(32)).decode()], "reserved"),
        ([f"k1:{base64.b64encode(b'a' * 32).decode()}", f"k1:{base64.b64encode(b'b' * 32).decode()}"], "appears twice"),
    ],
)
def test_a_missing_or_malformed_ring_is_a_system_check_error_with_the_fix(ring: Any, entries: list[str], says: str) -> None:
    ring(*entries)
    errors = sealing_ring_check()
    assert [e.id for e in errors] == ["tally.E001"] and says in errors[0].msg
    assert "os.urandom(32)" in errors[0].hint and "TALLY_SEALING_KEYS" in errors[0].hint
    with pytest.raises(SystemCheckError, match=r"tally\.E001"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


def test_a_well_formed_ring_passes_and_the_legacy_key_is_a_warning(ring: Any) -> None:
    ring(_key("k2"), "k1:" + base64.b64encode(os.urandom(32)).decode())  # urlsafe and standard base64 both read
    assert sealing_ring_check() == []
    ring(_key("k2"), legacy="old")
    assert [m.id for m in sealing_ring_check()] == ["tally.W001"]


# --- secrets_reseal: batched, resumable, every tenant ---------------------------------------------


def test_the_reseal_is_batched_resumable_and_reaches_a_switched_off_tenant(
    django_db_setup: None, django_db_blocker: Any, psp_simulator: Simulator, ring: Any, monkeypatch: Any
) -> None:
    """Committed batches on two scratch tenants, one switched off: stopped after two batches,
    the command run again finishes the rest, and the old key can then go."""
    from payments.management.commands import secrets_reseal

    key_a, key_b = _key("keyA"), _key("keyB")
    with django_db_blocker.unblock(), scratch_tenants(2, prefix="test_seal", legacy=()) as (on, off):
        ring(key_a)
        for tenant in (on, off):
            with schema_context(tenant.schema_name):
                psp_account_configure(psp_simulator)
                merchant = MerchantFactory()
                for n in range(7):
                    webhook_endpoint_create(merchant=merchant, url=f"https://93.184.215.14/hook{n}", enabled_events=["*"])
        Tenant.objects.filter(pk=off.pk).update(is_active=False)
        every = secrets_reseal.tenant_schemas_all  # the real selection, narrowed to these two
        monkeypatch.setattr(secrets_reseal, "tenant_schemas_all", lambda: [s for s in every() if s in (on.schema_name, off.schema_name)])
        ring(key_b, key_a)

        original = sealing._STORES["webhook_endpoints"]
        calls = {"n": 0}

        def stopping(after: str, limit: int) -> sealing.ResealBatch:
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt  # an operator's Ctrl-C, after two batches of two
            return original.reseal_batch(after, limit)

        monkeypatch.setitem(sealing._STORES, "webhook_endpoints", sealing.SealedStore(name="webhook_endpoints", reseal_batch=stopping))
        first = sorted((on.schema_name, off.schema_name))[0]
        with pytest.raises(KeyboardInterrupt):
            _reseal(batch=2)
        with schema_context(first):
            ids = [
                sealing.secret_key_id(scheme=WEBHOOK_SCHEME, stored=bytes(v))
                for v in WebhookEndpoint.objects.order_by("pk").values_list("secret_sealed", flat=True)
            ]
        assert ids == ["keyB"] * 4 + ["keyA"] * 3  # two batches committed, the rest not reached

        monkeypatch.setitem(sealing._STORES, "webhook_endpoints", original)
        out = _reseal(batch=2)  # run again: what is done is skipped, the rest re-sealed
        assert f"{first}: re-sealed" in out and "webhook_endpoints 3" in out.split(f"{first}:")[1].splitlines()[0]
        assert "webhook_endpoints 7" in out.split(f"{off.schema_name if first == on.schema_name else on.schema_name}:")[1].splitlines()[0]
        assert "done: 0 rows re-sealed" in _reseal(batch=2)

        ring(key_b)  # the old key removed, the processes restarted
        for tenant in (on, off):
            with schema_context(tenant.schema_name):
                assert _key_ids_stored() == {"keyB"}
                assert all(webhook_endpoint_secrets(endpoint=e).current.startswith("whsec_") for e in WebhookEndpoint.objects.all())
                assert gateway_secret_key(account=GatewayAccount.objects.get(gateway="simulator")).startswith("sk_sim_")


def test_a_value_that_does_not_open_is_reported_and_the_rest_is_resealed(tenant: Tenant, ring: Any) -> None:
    """A sealed value copied into another row (its associated data no longer matches) does
    not stop the run: every other value is re-sealed, and the command fails naming the row,
    so the old key is not removed while something still needs it."""
    from django.core.management.base import CommandError

    key_a, key_b = _key("keyA"), _key("keyB")
    ring(key_a, *ring.suite)
    merchant = MerchantFactory()
    good, _ = webhook_endpoint_create(merchant=merchant, url="https://93.184.215.14/good", enabled_events=["*"])
    bad, _ = webhook_endpoint_create(merchant=merchant, url="https://93.184.215.14/bad", enabled_events=["*"])
    WebhookEndpoint.objects.filter(pk=bad.pk).update(secret_sealed=good.secret_sealed)
    ring(key_b, key_a, *ring.suite)
    with pytest.raises(CommandError, match=f"{tenant.schema_name} webhook_endpoints {bad.pk}"):
        _reseal(tenant=tenant.schema_name)
    stored = dict(WebhookEndpoint.objects.filter(merchant=merchant).values_list("pk", "secret_sealed"))
    assert sealing.secret_key_id(scheme=WEBHOOK_SCHEME, stored=bytes(stored[good.pk])) == "keyB"
    assert sealing.secret_key_id(scheme=WEBHOOK_SCHEME, stored=bytes(stored[bad.pk])) == "keyA"


def test_make_run_writes_a_ring_under_var_once_and_reuses_it(tmp_path: Any, monkeypatch: Any) -> None:
    from devtools import run as runner

    monkeypatch.setattr(runner, "VAR", tmp_path)
    monkeypatch.setattr(runner, "ENV_FILE", tmp_path / "no.env")
    monkeypatch.delenv("TALLY_SEALING_KEYS", raising=False)
    old_umask = os.umask(0)  # a permissive umask: the file must still never be readable by others
    try:
        assert runner._sealing_ring_ensure() is True
    finally:
        os.umask(old_umask)
    ring_file = tmp_path / "sealing_keys"
    first = os.environ["TALLY_SEALING_KEYS"]
    primary = sealing.sealing_ring_parse(first.split(",")).primary
    assert ring_file.stat().st_mode & 0o777 == 0o600 and primary.startswith("local-") and len(primary) == len("local-") + 8
    monkeypatch.delenv("TALLY_SEALING_KEYS")
    assert runner._sealing_ring_ensure() is False and os.environ["TALLY_SEALING_KEYS"] == first
    monkeypatch.setenv("TALLY_SEALING_KEYS", "ops1:" + base64.b64encode(os.urandom(32)).decode())
    assert runner._sealing_ring_ensure() is False and os.environ["TALLY_SEALING_KEYS"].startswith("ops1:")


def test_make_run_uses_a_ring_set_in_dotenv(tmp_path: Any, monkeypatch: Any) -> None:
    """A ring in `.env` is the ring (the settings read `.env` too): no var/sealing_keys is
    written, and so no legacy re-seal runs."""
    from devtools import run as runner

    monkeypatch.setattr(runner, "VAR", tmp_path / "var")
    monkeypatch.setattr(runner, "ENV_FILE", tmp_path / ".env")
    monkeypatch.delenv("TALLY_SEALING_KEYS", raising=False)
    entry = "ops2:" + base64.b64encode(os.urandom(32)).decode()
    (tmp_path / ".env").write_text(f"TALLY_SEALING_KEYS={entry}\n")
    assert runner._sealing_ring_ensure() is False
    assert os.environ["TALLY_SEALING_KEYS"] == entry and not (tmp_path / "var" / "sealing_keys").exists()


# --- Stored answers that only look sealed ---------------------------------------------------------


def test_api_answers_that_echo_secret_sealed_neither_stop_nor_fail_the_reseal(tenant: Tenant, ring: Any) -> None:
    """Only a staff action's record holds a sealed secret inside JSON: an API answer that
    echoes client input named `secret_sealed` (as a value, nested, or a top-level key that
    is not base64) is not a sealed value, and the run completes with nothing unopened."""
    from idempotency.entry import idempotency_run
    from idempotency.models import IdempotencyRecord

    key_a, key_b = _key("keyA"), _key("keyB")
    ring(key_a, *ring.suite)
    principal = f"ter_{uuid.uuid4().hex[:12]}"
    answers = [{"name": "secret_sealed"}, {"metadata": {"secret_sealed": "x"}}, {"secret_sealed": "not base64!"}, {"secret_sealed": 7}]
    for n, value in enumerate(answers):
        idempotency_run(scope="terminal", principal_id=principal, key=f"echo-{n}", payload=n, fn=lambda _ctx, v=value: v)
    merchant = MerchantFactory()
    staff_key = f"staff-{uuid.uuid4().hex}"
    staff_action_run(user_id=4343, action="reveal", target=merchant, idempotency_key=staff_key, data={},
                     fn=lambda: ("revealed", "sk_once"), audit=False)
    ring(key_b, key_a, *ring.suite)
    out = _reseal(tenant=tenant.schema_name)
    assert "0 unopened" in out and "no legacy (v1) values remain" in out, out
    stored = {r.key: bytes(r.response_body) for r in IdempotencyRecord.objects.filter(principal_id=principal)}
    assert [json.loads(stored[f"echo-{n}"]) for n in range(len(answers))] == answers  # left exactly as they were
    staff = IdempotencyRecord.objects.get(principal_id="user:4343", key=staff_key)
    inner = base64.b64decode(json.loads(bytes(staff.response_body))["secret_sealed"])
    assert sealing.secret_key_id(scheme=sealing.SealScheme(purpose=b"", tag=b"tally-sealed"), stored=inner) == "keyB"


def test_a_staff_answer_whose_secret_is_malformed_is_reported_unopened(tenant: Tenant, ring: Any) -> None:
    from django.core.management.base import CommandError

    from idempotency.models import IdempotencyRecord

    ring(_key("keyA"), *ring.suite)
    merchant = MerchantFactory()
    staff_key = f"staff-{uuid.uuid4().hex}"
    staff_action_run(user_id=4344, action="reveal", target=merchant, idempotency_key=staff_key, data={},
                     fn=lambda: ("revealed", "sk_once"), audit=False)
    record = IdempotencyRecord.objects.get(principal_id="user:4344", key=staff_key)
    IdempotencyRecord.objects.filter(pk=record.pk).update(response_body=b'{"message":"x","secret_sealed":"not base64!"}')
    ring(_key("keyB"), *ring.suite)
    with pytest.raises(CommandError, match=f"idempotency_records {record.pk}"):
        _reseal(tenant=tenant.schema_name)


# --- Key ids, headers and material ----------------------------------------------------------------


def test_the_ring_repr_shows_no_key_material(ring: Any) -> None:
    material = os.urandom(32)
    parsed = sealing.sealing_ring_parse([f"k1:{base64.b64encode(material).decode()}"], legacy_secret_key="old-secret")
    shown = repr(parsed)
    assert "k1" in shown and repr(material) not in shown and "old-secret" not in shown and "keys" not in shown


def test_a_key_regenerated_under_the_same_id_changes_the_fingerprint(ring: Any) -> None:
    one = sealing.sealing_ring_parse([_key("k1")])
    again = sealing.sealing_ring_parse([_key("k1")])
    assert one.fingerprint != again.fingerprint
    assert one.fingerprint == sealing.sealing_ring_parse([f"k1:{base64.b64encode(one.keys['k1']).decode()}"]).fingerprint


def test_the_key_id_header_is_bound_and_legacy_is_no_v2_id(ring: Any) -> None:
    material = base64.b64encode(os.urandom(32)).decode()
    ring(f"k1:{material}", f"k2:{material}")  # the same material under two ids: only the header differs
    sealed = sealing.secret_seal(scheme=CREDENTIALS, plaintext=b"sk_live", associated_data=b"aad")
    assert sealing.secret_unseal(scheme=CREDENTIALS, sealed=sealed, associated_data=b"aad") == b"sk_live"
    swapped = sealed.replace(b":v2:k1:", b":v2:k2:", 1)
    with pytest.raises(InvalidTag):
        sealing.secret_unseal(scheme=CREDENTIALS, sealed=swapped, associated_data=b"aad")
    with pytest.raises(ValueError, match="invalid key id"):
        sealing.secret_key_id(scheme=CREDENTIALS, stored=sealed.replace(b":v2:k1:", b":v2:legacy:", 1))
    ring(f"k1:{material}", legacy="old-secret")
    with pytest.raises(ValueError, match="invalid key id"):
        sealing.secret_unseal(scheme=CREDENTIALS, sealed=sealed.replace(b":v2:k1:", b":v2:legacy:", 1), associated_data=b"aad")


def test_a_key_regenerated_under_the_first_keys_id_is_reported_not_skipped(tenant: Tenant, ring: Any) -> None:
    from django.core.management.base import CommandError

    ring(_key("keyA"), *ring.suite)
    endpoint, _ = webhook_endpoint_create(merchant=MerchantFactory(), url="https://93.184.215.14/regen", enabled_events=["*"])
    ring(_key("keyA"), *ring.suite)  # "keyA" again, but other material
    with pytest.raises(CommandError, match=f"webhook_endpoints {endpoint.pk}"):
        _reseal(tenant=tenant.schema_name)


def test_a_contact_token_no_key_opens_is_reported_and_the_run_goes_on(tenant: Tenant, ring: Any) -> None:
    from cryptography.fernet import Fernet
    from django.core.management.base import CommandError

    from wallets.models import Customer

    ring(_key("keyA"), *ring.suite)
    endpoint, _ = webhook_endpoint_create(merchant=MerchantFactory(), url="https://93.184.215.14/contacts", enabled_events=["*"])
    customer = customer_create(name=f"Bad token {uuid.uuid4().hex[:6]}")
    Customer.objects.filter(pk=customer.pk).update(email_ciphertext=Fernet(Fernet.generate_key()).encrypt(b"a@example.com").decode())
    ring(_key("keyB"), "keyA:" + base64.urlsafe_b64encode(sealing.sealing_ring().keys["keyA"]).decode(), *ring.suite)
    with pytest.raises(CommandError, match=f"customer_contacts {customer.pk}"):
        _reseal(tenant=tenant.schema_name)
    stored = WebhookEndpoint.objects.get(pk=endpoint.pk).secret_sealed
    assert sealing.secret_key_id(scheme=WEBHOOK_SCHEME, stored=bytes(stored)) == "keyB"  # stores after it still done


# --- A writer racing the reseal ------------------------------------------------------------------


@pytest.mark.parametrize("when", ["between_read_and_lock", "while_locked"])
def test_a_secret_rotated_while_the_reseal_runs_keeps_the_writers_value(
    django_db_setup: None, django_db_blocker: Any, ring: Any, monkeypatch: Any, when: str
) -> None:
    """A merchant rotating its webhook secret races the reseal's batch (real threads, real
    PostgreSQL): whether it commits after the reseal's unlocked read or waits on the row the
    reseal holds, the stored secret is the one the merchant was given, never the stale one."""
    import threading
    import time
    from datetime import timedelta

    from django.db import transaction

    from webhooks import secrets as webhook_secrets
    from webhooks.services.endpoints import webhook_endpoint_secret_rotate

    key_a, key_b = _key("keyA"), _key("keyB")
    with django_db_blocker.unblock(), scratch_tenants(1, prefix="test_race", legacy=()) as (scratch,):
        ring(key_a)
        with schema_context(scratch.schema_name):
            endpoint, first = webhook_endpoint_create(merchant=MerchantFactory(), url="https://93.184.215.14/race", enabled_events=["*"])
        ring(key_b, key_a)
        written: dict[str, str] = {}

        def rotate() -> None:
            try:
                with schema_context(scratch.schema_name), transaction.atomic():
                    written["secret"] = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(0))[1]
            finally:
                connection.close()

        writer = threading.Thread(target=rotate)
        real_lock = webhook_secrets.webhook_endpoint_rows_lock

        def racing_lock(**kwargs: Any) -> Any:
            if when == "between_read_and_lock":
                writer.start()
                writer.join(timeout=60)  # committed before the reseal locks
                return real_lock(**kwargs)
            rows = real_lock(**kwargs)
            writer.start()
            deadline = time.monotonic() + 60
            while writer.is_alive() and time.monotonic() < deadline:  # until it waits on our row lock
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                    if cursor.fetchone()[0]:
                        break
                time.sleep(0.01)
            return rows

        monkeypatch.setattr(webhook_secrets, "webhook_endpoint_rows_lock", racing_lock)
        with schema_context(scratch.schema_name):
            webhook_secrets.webhook_secrets_reseal()
        writer.join(timeout=60)
        assert not writer.is_alive() and written["secret"] != first
        with schema_context(scratch.schema_name):
            assert webhook_endpoint_secrets(endpoint=WebhookEndpoint.objects.get(pk=endpoint.pk)).current == written["secret"]
