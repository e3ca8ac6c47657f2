"""Migrations apply forward and back: from head to before the payment function was dropped
(payments 0008, which also unapplies wallets 0007), and to head again, on a tenant of its
own with payments in it, so the backward steps meet real rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from payments.services.adjustments import adjustment_create
from payments.services.charges import payment_create
from payments.services.refunds import refund_create
from tenants.models import Tenant
from tenants.services import tenant_create
from tests.conftest import in_tenant
from wallets.services.principals import customer_create, merchant_create, staff_member_get_or_create, store_create, terminal_create

BEFORE_THE_DROP = "0008_payment_token_single_use"


@pytest.fixture
def scratch_tenant(django_db_setup: None, django_db_blocker: Any) -> Iterator[Tenant]:
    with django_db_blocker.unblock():
        schema = f"test_migr_{uuid.uuid4().hex[:8]}"
        tenant = tenant_create(schema_name=schema, domain=f"{schema}.test.localhost", name="Migrations", main_currency="JPY")
        tenant.charge_by_customer_id = True  # the test pays by customer id
        tenant.save(update_fields=["charge_by_customer_id"])
        try:
            yield tenant
        finally:
            connection.set_schema_to_public()
            tenant.delete(force_drop=True)


def _function_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema() AND p.proname = %s",
            [name],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        row = cursor.fetchone()
    return bool(row and row[0])


def _migrate(schema: str, *target: str) -> None:
    """`target` is (app, migration); none means every app to its head."""
    call_command("migrate_schemas", *target, schema_name=schema, interactive=False, verbosity=0)


def test_migrations_go_back_before_the_drop_and_forward_to_head(scratch_tenant: Tenant) -> None:
    schema = scratch_tenant.schema_name
    with in_tenant(scratch_tenant):
        customer = customer_create(name="Mig")
        terminal = terminal_create(store=store_create(merchant=merchant_create(name="Shop"), name="S"), name="T")
        adjustment_create(
            staff=staff_member_get_or_create(username="mig"), customer=customer, asset_code="JPY", amount=5_000,
            direction="credit", reason="test",
        )
        payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=2_000)  # 1,000 g of CO2
        refund_create(payment=payment, amount=500)  # 250 g back
        assert not _function_exists("tally_payment_create")
        assert not _table_exists("wallets_carbonimpact")

    _migrate(schema, "payments", BEFORE_THE_DROP)
    with in_tenant(scratch_tenant):
        assert _function_exists("tally_payment_create") and _function_exists("tally_customer_reward_credit")
        with connection.cursor() as cursor:
            cursor.execute("SELECT SUM(grams) FROM wallets_carbonimpact")
            row = cursor.fetchone()
        assert row is not None and row[0] == 2 * 750  # the customer's and the merchant's aggregate, refilled
        # The previous code's payment path works on the rolled-back schema.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT code FROM tally_payment_create('pay_migrtest', 'txn_migrtest', 'evt_migrtest', %s, %s, NULL, 'JPY', 100, 1, 50,"
                " 'POINT', 'CARBON', 32, now())",
                [customer.pk, terminal.pk],
            )
            result = cursor.fetchone()
        assert result == ("ok",)

    _migrate(schema)
    with in_tenant(scratch_tenant):
        assert not _function_exists("tally_payment_create") and not _function_exists("tally_customer_reward_credit")
        assert not _table_exists("wallets_carbonimpact")
        payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100)
