"""The staged migration `webhook_secrets` (webhooks.secrets): plaintext signing secrets
re-sealed online, on scratch tenants with committed data. A tenant from before the
migration is made by putting its state back to `absent` (a new tenant starts sealed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from idempotency.staff import staff_action_run
from tenants.models import Tenant
from tests.factories import MerchantFactory
from tests.staged_support import scratch_tenants, staged
from wallets.models import AuditEntry, Merchant, StagedMigrationState, StagedPhase
from wallets.staged.phases import staged_phase_forget
from wallets.staged.runner import staged_backfill
from webhooks.models import WebhookEndpoint
from webhooks.secrets import WebhookSecretsMigration, webhook_endpoint_secrets
from webhooks.services.endpoints import webhook_endpoint_create, webhook_endpoint_secret_rotate, webhook_endpoint_signing_secrets

SECRETS = "webhook_secrets"


@pytest.fixture
def scratch(django_db_setup: None, django_db_blocker: Any) -> Iterator[Tenant]:
    with django_db_blocker.unblock(), scratch_tenants(1, prefix="test_ws") as (tenant,):
        connection.set_tenant(tenant)
        yield tenant


@pytest.fixture
def legacy(scratch: Tenant) -> Tenant:
    """The scratch tenant as one from before the migration: plaintext secrets."""
    StagedMigrationState.objects.filter(name=SECRETS).delete()
    staged_phase_forget()
    return scratch


def _create(merchant: Merchant, n: int) -> tuple[WebhookEndpoint, str]:
    return webhook_endpoint_create(merchant=merchant, url=f"https://93.184.215.14/hook{n}", enabled_events=["*"])


def _raw(endpoint_id: str) -> dict[str, Any]:
    """The row's secret columns as the database holds them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT secret, previous_secret, secret_sealed, previous_secret_sealed FROM webhooks_webhookendpoint WHERE id = %s", [endpoint_id]
        )
        row = cursor.fetchone()
    assert row is not None
    return dict(zip(("secret", "previous_secret", "secret_sealed", "previous_secret_sealed"), row, strict=True))


def _signing(endpoint_id: str) -> list[str]:
    staged_phase_forget()
    return webhook_endpoint_signing_secrets(endpoint=WebhookEndpoint.objects.get(pk=endpoint_id))


def _phase() -> str:
    return str(StagedMigrationState.objects.get(name=SECRETS).phase)


class _Stop(Exception):
    pass


def test_a_new_tenant_starts_sealed(scratch: Tenant) -> None:
    state = StagedMigrationState.objects.get(name=SECRETS)
    assert state.phase == StagedPhase.CONTRACTED and state.history[-1]["note"] == "no old data: new representation only"
    endpoint, secret = _create(MerchantFactory(), 1)
    raw = _raw(endpoint.pk)
    assert (raw["secret"], raw["previous_secret"]) == ("", "") and secret.encode() not in bytes(raw["secret_sealed"])
    assert _signing(endpoint.pk) == [secret]
    assert staged(SECRETS, "expand", tenant=scratch).out.strip().endswith("already contracted: expand is a no-op")


def test_plaintext_secrets_are_resealed_online_and_read_right_in_every_phase(legacy: Tenant) -> None:
    merchant = MerchantFactory()
    rotated, first = _create(merchant, 1)
    rotated, second = webhook_endpoint_secret_rotate(endpoint=rotated, overlap=timedelta(hours=1))
    plain, plain_secret = _create(merchant, 2)
    assert _raw(plain.pk)["secret"] == plain_secret and _raw(plain.pk)["secret_sealed"] is None  # today's rows
    expected = {rotated.pk: [second, first], plain.pk: [plain_secret]}

    def reads_right() -> None:
        for endpoint_id, secrets in expected.items():
            assert _signing(endpoint_id) == secrets, endpoint_id

    assert staged(SECRETS, "expand", tenant=legacy).code == 0
    staged_phase_forget()
    both, both_secret = _create(merchant, 3)  # dual write: both columns
    raw = _raw(both.pk)
    assert raw["secret"] == both_secret and raw["secret_sealed"] is not None
    expected[both.pk] = [both_secret]
    late, late_secret = _create(merchant, 4)
    expected[late.pk] = [late_secret]
    reads_right()

    # Stopped after one batch of one, resumed by the command with batches of two.
    def stop_after_one(done: int, total: int, rate: float) -> None:
        raise _Stop

    with pytest.raises(_Stop):
        staged_backfill(migration=WebhookSecretsMigration(), batch=1, progress=stop_after_one)
    state = StagedMigrationState.objects.get(name=SECRETS)
    assert state.phase == StagedPhase.EXPANDED and state.rows_done == 1 and state.cursor == min(expected)
    unsealed = {pk for pk in expected if _raw(pk)["secret_sealed"] is None}
    assert unsealed == {pk for pk in (rotated.pk, plain.pk) if pk > state.cursor}  # the older rows past the cursor
    reads_right()  # plaintext and sealed rows side by side
    dry = staged(SECRETS, "backfill", tenant=legacy, dry_run=True)
    assert dry.code == 0 and "would be written" in dry.out
    resumed = staged(SECRETS, "backfill", tenant=legacy, batch=2)
    assert resumed.code == 0, resumed
    state = StagedMigrationState.objects.get(name=SECRETS)
    assert (state.phase, state.rows_done, state.rows_total) == (StagedPhase.BACKFILLED, 4, 4)
    assert all(_raw(pk)["secret_sealed"] is not None for pk in expected)
    assert _raw(rotated.pk)["previous_secret_sealed"] is not None and _raw(plain.pk)["previous_secret_sealed"] is None
    reads_right()

    verified = staged(SECRETS, "verify", tenant=legacy)
    assert verified.code == 0 and "endpoints=4" in verified.out and "sealed=4" in verified.out, verified
    assert staged(SECRETS, "switch-reads", tenant=legacy).code == 0
    # Reads come from the sealed columns now: the plaintext no longer matters.
    WebhookEndpoint.objects.filter(pk=plain.pk).update(secret_plaintext="whsec_not_the_secret")
    reads_right()

    assert staged(SECRETS, "contract", tenant=legacy).code == 0
    assert _phase() == StagedPhase.CONTRACTED
    assert "no-op" in staged(SECRETS, "contract", tenant=legacy).out
    for pk in expected:
        raw = _raw(pk)
        assert (raw["secret"], raw["previous_secret"]) == ("", "")
    reads_right()
    rotated, third = webhook_endpoint_secret_rotate(endpoint=WebhookEndpoint.objects.get(pk=rotated.pk), overlap=timedelta(hours=1))
    assert _signing(rotated.pk) == [third, second] and _raw(rotated.pk)["secret"] == ""
    refused = staged(SECRETS, "rollback", tenant=legacy)
    assert refused.code == 1 and "rollback refused: phase is contracted" in refused.err


def test_the_reseal_never_overwrites_what_the_new_path_wrote(legacy: Tenant) -> None:
    merchant = MerchantFactory()
    endpoint, _ = _create(merchant, 1)
    other, _ = _create(merchant, 2)
    assert staged(SECRETS, "expand", tenant=legacy).code == 0
    staged_phase_forget()
    endpoint, new_secret = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(0))
    sealed_by_rotation = bytes(_raw(endpoint.pk)["secret_sealed"])
    run = staged(SECRETS, "backfill", tenant=legacy)
    assert run.code == 0
    state = StagedMigrationState.objects.get(name=SECRETS)
    assert (state.rows_done, state.rows_written) == (2, 1)  # only `other` needed sealing
    assert bytes(_raw(endpoint.pk)["secret_sealed"]) == sealed_by_rotation
    assert staged(SECRETS, "verify", tenant=legacy).code == 0
    assert staged(SECRETS, "switch-reads", tenant=legacy).code == 0
    assert _signing(endpoint.pk) == [new_secret] and _signing(other.pk)


def test_a_failed_reseal_verify_names_endpoints_never_secrets_and_blocks_contract(legacy: Tenant) -> None:
    endpoint, secret = _create(MerchantFactory(), 1)
    for phase in ("expand", "backfill", "verify", "switch-reads"):
        assert staged(SECRETS, phase, tenant=legacy).code == 0
    # Someone writes the plaintext column behind the services' back.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret_plaintext="whsec_mallory")
    failed = staged(SECRETS, "verify", tenant=legacy)
    assert failed.code == 1 and f"{endpoint.pk}: secret differs" in failed.err, failed
    assert "mallory" not in failed.err and secret not in failed.err
    report = json.dumps(StagedMigrationState.objects.get(name=SECRETS).verify_report)
    assert "mallory" not in report and secret not in report
    refused = staged(SECRETS, "contract", tenant=legacy)
    assert refused.code == 1 and "verify has not passed" in refused.err
    assert _raw(endpoint.pk)["secret"] == "whsec_mallory"  # nothing emptied


def test_rolling_the_reseal_back_to_absent_discards_the_sealed_columns(legacy: Tenant) -> None:
    endpoint, secret = _create(MerchantFactory(), 1)
    for phase in ("expand", "backfill"):
        assert staged(SECRETS, phase, tenant=legacy).code == 0
    assert _raw(endpoint.pk)["secret_sealed"] is not None
    for _ in range(2):
        assert staged(SECRETS, "rollback", tenant=legacy).code == 0
    assert _phase() == StagedPhase.ABSENT
    raw = _raw(endpoint.pk)
    assert (raw["secret"], raw["secret_sealed"], raw["previous_secret_sealed"]) == (secret, None, None)
    assert _signing(endpoint.pk) == [secret]
    for phase in ("expand", "backfill", "verify", "switch-reads", "contract"):
        assert staged(SECRETS, phase, tenant=legacy).code == 0, phase
    assert _signing(endpoint.pk) == [secret] and _raw(endpoint.pk)["secret"] == ""


def test_an_admin_actions_audit_entry_never_holds_a_plaintext_secret(legacy: Tenant) -> None:
    endpoint, secret = _create(MerchantFactory(), 1)
    assert webhook_endpoint_secrets(endpoint=endpoint).current == secret  # still plaintext at rest here
    staff_action_run(
        user_id=None, action="disable", target=endpoint, idempotency_key="k-audit-1", data={}, fn=lambda: "disabled",
    )
    entry = AuditEntry.objects.get(action="admin.disable", target_id=endpoint.pk)
    assert entry.before is not None and "url" in entry.before
    assert secret not in json.dumps(entry.before) + json.dumps(entry.after)
