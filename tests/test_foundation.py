"""Foundation: tenant isolation, cache isolation, health endpoints, commands."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.test import Client

from tenants.models import Domain, Tenant
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
        assert Account.objects.filter(kind="system").count() == 6
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
def test_metrics_endpoint_speaks_prometheus_on_the_platform_host_or_to_its_token(tenant_a: Tenant, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TALLY_PUBLIC_DOMAIN = "public.test.localhost"
    settings.TALLY_METRICS_TOKEN = "scrape-" + "x" * 24
    settings.TALLY_METRICS_ON_PLATFORM_HOST = True
    response = Client(HTTP_HOST="public.test.localhost").get("/metrics")
    assert response.status_code == 200
    assert b"tally_requests_total" in response.content
    # A tenant's host: platform-wide counters and every tenant's schema name are not its to see.
    tenant_host = Client(HTTP_HOST="a.test.localhost")
    assert tenant_host.get("/metrics").status_code == 404
    assert tenant_host.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
    scraped = tenant_host.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.TALLY_METRICS_TOKEN}")
    assert scraped.status_code == 200 and b"tally_requests_total" in scraped.content
    # Production: anyone can send the platform's Host header to the shared server; only the token opens it.
    settings.TALLY_METRICS_ON_PLATFORM_HOST = False
    assert Client(HTTP_HOST="public.test.localhost").get("/metrics").status_code == 404
    assert tenant_host.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.TALLY_METRICS_TOKEN}").status_code == 200


@pytest.mark.django_db
def test_unknown_host_gets_404_not_another_tenant(tenant_a: Tenant) -> None:
    response = Client(HTTP_HOST="nobody.example").get("/v1/customer/wallet")
    assert response.status_code == 404


def test_create_tenant_and_staff_key_commands(django_db_setup: None, django_db_blocker, capsys) -> None:  # type: ignore[no-untyped-def]
    schema = f"cmd_{int(time.time() * 1000) % 10_000_000}"
    with django_db_blocker.unblock():
        call_command("create_tenant", schema=schema, domain=f"{schema}.localhost", name="Cmd", currency="JPY")
        call_command("create_staff_key", tenant=schema, username="ops")
        out = capsys.readouterr().out.strip().splitlines()
        assert out[-1].startswith("ak_") and len(out[-1]) > 30
        call_command("list_tenants")
        assert schema in capsys.readouterr().out
        connection.set_schema_to_public()
    # How fast tenant creation is, is measured by bench/bench_tenants.py, not asserted here:
    # a timed test fails on a busy machine and proves nothing on an idle one.


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


@pytest.mark.django_db
def test_every_request_logs_one_json_line_with_its_request_id_and_no_secrets(tenant_a: Tenant, capfd) -> None:  # type: ignore[no-untyped-def]
    import logging

    from config.observability import LogContextFilter

    handler_stream: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            handler_stream.append(self.format(record))

    from pythonjsonlogger.json import JsonFormatter

    handler = Collect()
    handler.addFilter(LogContextFilter())
    handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s %(request_id)s %(tenant)s"))
    logger = logging.getLogger("tally.request")
    logger.addHandler(handler)
    try:
        response = Client(HTTP_HOST="a.test.localhost").get(
            "/v1/customer/wallet", HTTP_AUTHORIZATION="Bearer ck_supersecretvalue1234567890"
        )
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in handler_stream]
    assert len(lines) == 1
    assert lines[0]["request_id"] == response["Request-Id"]
    assert lines[0]["tenant"] == tenant_a.schema_name
    assert lines[0]["path"] == "/v1/customer/wallet"
    assert "supersecret" not in handler_stream[0]


def test_production_settings_refuse_to_start_without_required_values() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL"}}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.production"
    code = "import django; django.setup()"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set in production" in result.stderr
    env.update(DJANGO_SECRET_KEY="x" * 50, DJANGO_ALLOWED_HOSTS="tally.example", DATABASE_URL="postgres://u@127.0.0.1:5432/x")
    env.pop("TALLY_CONTACT_ENCRYPTION_KEYS", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "TALLY_CONTACT_ENCRYPTION_KEYS must be set in production" in result.stderr
    env.update(TALLY_CONTACT_ENCRYPTION_KEYS="ZmVybmV0LWtleS1mb3ItdGhlLXRlc3Qtb25seS0xMjM=", TALLY_CONTACT_HASH_KEY="h" * 40)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.django_db
def test_platform_admin_lists_tenants_but_a_tenant_admin_does_not(tenant_a: Tenant) -> None:
    from django.contrib.auth import get_user_model

    connection.set_schema_to_public()
    user_model = get_user_model()
    user_model.objects.create_superuser(username="platform-root", password="pw-123456")
    public = Client(HTTP_HOST="public.test.localhost")
    public.login(username="platform-root", password="pw-123456")
    assert public.get("/admin/tenants/tenant/").status_code == 200

    tenant_admin = Client(HTTP_HOST="a.test.localhost")
    with in_tenant(tenant_a):  # login() authenticates in the current schema
        user_model.objects.create_superuser(username="tenant-root", password="pw-123456")
        assert tenant_admin.login(username="tenant-root", password="pw-123456")
    assert tenant_admin.get("/admin/").status_code == 200
    assert tenant_admin.get("/admin/tenants/tenant/").status_code == 404
    assert tenant_admin.get("/admin/django_celery_beat/periodictask/").status_code == 404


def test_a_tenant_added_in_the_platform_admin_is_set_up_like_one_made_by_tenant_create(
    django_db_setup: None, django_db_blocker: Any
) -> None:
    from django.contrib.auth import get_user_model

    schema = f"adm_{int(time.time() * 1000) % 10_000_000}"
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        get_user_model().objects.filter(username="platform-adder").delete()
        get_user_model().objects.create_superuser(username="platform-adder", password="pw-123456")
        public = Client(HTTP_HOST="public.test.localhost")
        assert public.login(username="platform-adder", password="pw-123456")
        with connection.cursor() as cursor:  # gone with the session the clone must not run on
            cursor.execute("PREPARE tally_probe AS SELECT 1")
        r = public.post("/admin/tenants/tenant/add/", {
            "schema_name": schema, "name": "Added", "is_active": "on", "main_currency": "EUR",
            "currency_exponent": 2, "points_earn_rate": "0", "topup_bonus_rate": "0", "carbon_grams_per_unit": "0",
            "idempotency_replay_window_seconds": 86400, "idempotency_tombstone_window_seconds": 604800,
            "idempotency_wait_ms": 0, "extra_settings": "{}", "refund_fee_policy": "proportional", "settlement_delay_days": 2,
            "time_zone": "Europe/Berlin",
            "domains-TOTAL_FORMS": 1, "domains-INITIAL_FORMS": 0,
            "domains-0-domain": f"{schema}.localhost", "domains-0-is_primary": "on",
        })
        assert r.status_code == 302, r.content.decode()[:3000]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = 'tally_probe'")
            assert cursor.fetchone()[0] == 0
        tenant = Tenant.objects.get(schema_name=schema)
        assert Domain.objects.filter(tenant=tenant, domain=f"{schema}.localhost").exists()
        assert tenant.time_zone == "Europe/Berlin"
        with in_tenant(tenant):
            assert Asset.objects.get(is_main=True).code == "EUR"
            assert Account.objects.filter(kind="system").count() == 6
        connection.set_schema_to_public()


@pytest.mark.django_db
@pytest.mark.usefixtures("settings")
def test_tenant_lookup_is_cached_but_a_settings_change_is_seen_at_once(tenant_a: Tenant) -> None:
    from django.conf import settings
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from tenants.middleware import CachedTenantMiddleware, tenant_cache_clear

    settings.TENANT_CACHE_SECONDS = 10.0  # the pytest-django `settings` fixture restores it
    seen: list[Tenant] = []

    def remember(request):  # type: ignore[no-untyped-def]
        seen.append(request.tenant)

    middleware = CachedTenantMiddleware(remember)
    request = RequestFactory(HTTP_HOST="a.test.localhost").get("/")
    tenant_cache_clear()
    middleware(request)
    with CaptureQueriesContext(connection) as queries:
        middleware(request)
    assert not any("tenants_domain" in q["sql"] for q in queries.captured_queries)

    connection.set_schema_to_public()
    tenant = Tenant.objects.get(pk=tenant_a.pk)
    tenant.idempotency_wait_ms = 1234
    tenant.save(update_fields=["idempotency_wait_ms"])  # clears this process's cache
    middleware(request)
    assert seen[-1].idempotency_wait_ms == 1234


@pytest.mark.django_db
def test_a_switched_off_tenant_answers_as_an_unknown_host_until_switched_on(tenant_a: Tenant) -> None:
    """Beat does no work in an inactive tenant, so its hosts must take no payments either:
    the API answers the 404 envelope and the admin a plain 404, as for a host nobody has.
    The PSP's webhooks still land (they settle top-ups charged before the switch), and the
    platform's own tenant cannot be switched off."""
    from tenants.middleware import tenant_cache_clear

    client = Client(HTTP_HOST=tenant_a.domains.get().domain)
    psp = "/v1/psp/webhooks/simulator"
    assert client.get("/v1/customer/wallet").status_code == 401  # switched on: found, asks for a key
    assert client.get("/admin/login/").status_code == 200
    connection.set_schema_to_public()
    tenant = Tenant.objects.get(pk=tenant_a.pk)
    tenant.is_active = False
    tenant.save(update_fields=["is_active"])  # as the platform admin saves it (the tenant cache is cleared)
    try:
        r = client.get("/v1/customer/wallet")
        assert r.status_code == 404 and r.json()["error"]["code"] == "resource_missing"
        assert client.post("/v1/terminal/payments", data="{}", content_type="application/json").status_code == 404
        assert client.get("/admin/login/").status_code == 404
        landed = client.post(psp, data="{}", content_type="application/json")
        assert landed.json()["error"]["param"] == "gateway", landed.content  # the webhook view answered: no gateway set up here
        connection.set_schema_to_public()
        public = Tenant.objects.get(schema_name="public")
        public.is_active = False
        public.save(update_fields=["is_active"])
        assert Client(HTTP_HOST="public.test.localhost").get("/admin/login/").status_code == 200
    finally:
        connection.set_schema_to_public()
        Tenant.objects.filter(schema_name__in=[tenant_a.schema_name, "public"]).update(is_active=True)
        tenant_cache_clear()
    assert client.get("/v1/customer/wallet").status_code == 401


def test_database_down_before_tenant_resolution_answers_503_envelope(live_tenant: Tenant) -> None:
    import threading

    from django.conf import settings
    from django.db import connections

    from tests.proxies import TcpProxy

    proxy = TcpProxy(int(settings.DATABASES["default"].get("PORT") or 5432))
    proxy.cut()
    box: dict[str, object] = {}

    def call() -> None:
        conn = connections["default"]
        conn.close()
        conn.settings_dict = {**conn.settings_dict, "PORT": proxy.port}
        try:
            box["response"] = Client(HTTP_HOST="a.test.localhost", raise_request_exception=False).get("/v1/customer/wallet")
        finally:
            conn.close()

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(30)
    proxy.close()
    response = box["response"]
    assert response.status_code == 503, response.content  # type: ignore[attr-defined]
    body = json.loads(response.content)  # type: ignore[attr-defined]
    assert body["error"]["code"] == "unavailable"
    assert int(response["Retry-After"]) >= 1  # type: ignore[index]


def test_demo_seed_is_idempotent_and_replaces_keys_this_database_does_not_know(
    django_db_setup: None, django_db_blocker, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    from devtools.demo_seed import demo_seed
    from wallets.selectors import api_key_get_active

    keys_file = tmp_path / "demo_keys.json"
    with django_db_blocker.unblock():
        first = demo_seed(keys_file=keys_file)
        second = demo_seed(keys_file=keys_file)
        assert second["keys"] == first["keys"] and second["ids"] == first["ids"]
        saved = json.loads(keys_file.read_text())
        saved["keys"]["terminal"] = "tk_from_another_database_0000000000000000"
        keys_file.write_text(json.dumps(saved))
        healed = demo_seed(keys_file=keys_file)
        assert healed["keys"]["terminal"] != saved["keys"]["terminal"]
        assert healed["keys"]["customer_alice"] == first["keys"]["customer_alice"]
        with in_tenant(Tenant.objects.get(schema_name="demo")):
            for label, raw in healed["keys"].items():
                assert api_key_get_active(raw_key=raw) is not None, label
        connection.set_schema_to_public()
