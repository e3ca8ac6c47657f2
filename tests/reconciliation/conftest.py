"""Fixtures for the reconciliation tests: a tenant of their own (`test_recon`), since other
tests leave committed rows (races, live relays) in tenants A and B that would be findings
here; clean, busy data in it; and a run helper."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from payments.services.charges import payment_create
from payments.services.intents import payment_intent_confirm, payment_intent_create
from payments.services.refunds import refund_create
from payments.services.transfers import transfer_create
from reconciliation.models import ReconciliationRun, RunTrigger
from reconciliation.services import reconciliation_run_execute, reconciliation_run_request
from tenants.models import Tenant
from tenants.services import tenant_create
from tests.factories import CustomerFactory, TerminalFactory, fund
from wallets.models import Hold, HoldStatus

RECON_TENANT = {"schema_name": "test_recon", "domain": "recon.test.localhost", "name": "Recon", "main_currency": "JPY"}


@pytest.fixture(scope="session")
def recon_tenant_committed(django_db_setup: None, django_db_blocker: Any) -> Tenant:
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        tenant = Tenant.objects.filter(schema_name=RECON_TENANT["schema_name"]).first()
        if tenant is None:
            tenant = tenant_create(**RECON_TENANT)
            Tenant.objects.filter(pk=tenant.pk).update(charge_by_customer_id=True)
            tenant.refresh_from_db()
        connection.set_schema_to_public()
        return tenant


@pytest.fixture
def recon_tenant(db: None, recon_tenant_committed: Tenant) -> Iterator[Tenant]:
    """The reconciliation tenant, inside the test's rolled-back transaction."""
    connection.set_tenant(recon_tenant_committed)
    yield recon_tenant_committed
    connection.set_schema_to_public()


def reconcile() -> ReconciliationRun:
    """Request and execute a run in the current tenant."""
    run = reconciliation_run_request(trigger=RunTrigger.COMMAND)
    return reconciliation_run_execute(run_id=run.pk, chunk_size=3)  # tiny chunks: the streaming paths go round


def kinds(run: ReconciliationRun) -> dict[str, int]:
    return dict(run.report["by_kind"])


@pytest.fixture
def world(recon_tenant: Tenant) -> dict[str, Any]:
    """Clean, busy data: funding, payments, a refund, a transfer, an authorized intent (a hold)."""
    alice, bob = CustomerFactory(), CustomerFactory()
    terminal = TerminalFactory()
    fund(alice, 100_000)
    fund(bob, 5_000)
    pay = payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=1200)
    payment_create(terminal=terminal, customer=alice, asset_code="JPY", amount=800)
    payment_create(terminal=terminal, customer=bob, asset_code="JPY", amount=1200)  # same amount, another customer
    refund_create(payment=pay, amount=200, reason="test")
    transfer_create(from_customer=alice, to_customer=bob, asset_code="JPY", amount=300)
    intent = payment_intent_create(merchant=terminal.store.merchant, customer=alice, asset_code="JPY", amount=500, capture_method="manual")
    payment_intent_confirm(intent=intent)  # manual capture: confirming authorizes (a hold)
    assert Hold.objects.filter(status=HoldStatus.ACTIVE).exists()
    return {"alice": alice, "bob": bob, "terminal": terminal, "payment": pay}


