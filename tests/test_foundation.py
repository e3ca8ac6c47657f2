"""Foundation: tenant isolation, cache isolation, health endpoints, commands."""

from __future__ import annotations

import json
import time

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.test import Client

from tenants.models import Tenant
from tests.conftest import in_tenant
from wallets.models import Account, Asset, Customer
from wallets.services.principals import customer_create


def _table_visible(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [name])
        return cursor.fetchone()[0] is not None


@pytest.mark.django_db
def test_row_in_one_tenant_is_invisible_from_the_other_and_from_public(tenant_a: Tenant, tenant_b: Tenant) -> None:
    with in_tenant(tenant_a):
        customer = customer_create(name="Only in A")
        assert Customer.objects.filter(id=customer.id).exists()
    with in_tenant(tenant_b):
        assert not Customer.objects.filter(id=customer.id).exists()
        assert not Account.objects.filter(customer_id=customer.id).exists()
    connection.set_schema_to_public()
    assert not _table_visible("wallets_customer")  # tenant tables do not exist in public
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{tenant_b.schema_name}".wallets_customer WHERE id = %s', [customer.id])
        assert cursor.fetchone()[0] == 0
        cursor.execute(f'SELECT count(*) FROM "{tenant_a.schema_name}".wallets_customer WHERE id = %s', [customer.id])
        assert cursor.fetchone()[0] == 1


@pytest.mark.django_db
def test_cache_entries_are_per_tenant(tenant_a: Tenant, tenant_b: Tenant) -> None:
    with in_tenant(tenant_a):
        cache.set("isolation-probe", "A", 30)
        assert cache.get("isolation-probe") == "A"
    with in_tenant(tenant_b):
        assert cache.get("isolation-probe") is None
    with in_tenant(tenant_a):
        cache.delete("isolation-probe")


@pytest.mark.django_db
def test_new_tenant_has_assets_and_system_accounts(tenant_a: Tenant, tenant_b: Tenant) -> None:
    with in_tenant(tenant_a):
        assert Asset.objects.get(is_main=True).code == "JPY"
        assert set(Asset.objects.values_list("code", flat=True)) == {"JPY", "POINT", "CARBON"}
        assert Account.objects.filter(kind="system").count() == 5
    with in_tenant(tenant_b):
        main = Asset.objects.get(is_main=True)
        assert (main.code, main.exponent) == ("EUR", 2)


@pytest.mark.django_db(transaction=False)
def test_healthz_and_readyz_on_tenant_and_unknown_hosts(tenant_a: Tenant) -> None:
    for host in ("a.test.localhost", "unknown.example"):
        client = Client(HTTP_HOST=host)
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        body = json.loads(response.content)
        assert response.status_code == 200, body
        assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"] and body["checks"]["migrations"]["ok"]
        assert response["Request-Id"].startswith("req_")


@pytest.mark.django_db
def test_metrics_endpoint_speaks_prometheus(tenant_a: Tenant) -> None:
    response = Client(HTTP_HOST="a.test.localhost").get("/metrics")
    assert response.status_code == 200
    assert b"tally_requests_total" in response.content


@pytest.mark.django_db
def test_unknown_host_gets_404_not_another_tenant(tenant_a: Tenant) -> None:
    response = Client(HTTP_HOST="nobody.example").get("/v1/customer/wallet")
    assert response.status_code == 404


def test_create_tenant_and_staff_key_commands(django_db_setup: None, django_db_blocker, capsys) -> None:  # type: ignore[no-untyped-def]
    schema = f"cmd_{int(time.time() * 1000) % 10_000_000}"
    with django_db_blocker.unblock():
        started = time.perf_counter()
        call_command("create_tenant", schema=schema, domain=f"{schema}.localhost", name="Cmd", currency="JPY")
        elapsed = time.perf_counter() - started
        call_command("create_staff_key", tenant=schema, username="ops")
        out = capsys.readouterr().out.strip().splitlines()
        assert out[-1].startswith("ak_") and len(out[-1]) > 30
        call_command("list_tenants")
        assert schema in capsys.readouterr().out
        connection.set_schema_to_public()
    # Cloning the template schema keeps tenant creation fast (issue: under 2 s).
    assert elapsed < 2.0, elapsed


def test_cloned_tenant_schema_matches_template(django_db_setup: None, django_db_blocker, tenant_a: Tenant) -> None:  # type: ignore[no-untyped-def]
    sql = (
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s ORDER BY 1, 2"
    )
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(sql, ["tenant_template"])
        template = cursor.fetchall()
        cursor.execute(sql, [tenant_a.schema_name])
        assert cursor.fetchall() == template
        cursor.execute(
            "SELECT count(*) FROM information_schema.triggers WHERE trigger_schema = %s", ["tenant_template"]
        )
        template_triggers = cursor.fetchone()[0]
        cursor.execute(
            "SELECT count(*) FROM information_schema.triggers WHERE trigger_schema = %s", [tenant_a.schema_name]
        )
        assert cursor.fetchone()[0] == template_triggers
