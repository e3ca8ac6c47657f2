"""The tenant-aware database backend (tenants/postgresql_backend): between requests a
persistent connection is health-checked, and that check sets the request's search_path,
so the request sends no `SET search_path` of its own."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from tenants.models import Tenant


def _sent_and_path() -> tuple[list[str], str]:
    sent: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('search_path')")
        (path,) = cursor.fetchone()
    return sent, str(path)


def _next_request() -> None:
    """What Django does to a persistent connection at a request's edge: the next cursor
    health-checks it first (close_if_unusable_or_obsolete)."""
    assert connection.health_check_enabled  # CONN_HEALTH_CHECKS, config/settings/base.py
    connection.health_check_done = False


@pytest.mark.django_db(transaction=False)
def test_the_health_check_sets_the_requests_path_in_its_own_round_trip(tenant_a: Tenant, tenant_b: Tenant) -> None:
    for tenant in (tenant_a, tenant_b, tenant_a):
        connection.set_tenant(tenant)  # as the tenant middleware does on every request
        _next_request()
        sent, path = _sent_and_path()
        assert sent == ["SELECT current_setting('search_path')"]  # no SET search_path of its own
        assert path == f'"{tenant.schema_name}", public' or path == f"{tenant.schema_name}, public"
    connection.set_schema_to_public()
    _next_request()
    sent, path = _sent_and_path()
    assert sent == ["SELECT current_setting('search_path')"] and path == "public"


@pytest.mark.django_db(transaction=False)
def test_within_a_request_a_tenant_switch_still_sets_the_path(tenant_a: Tenant, tenant_b: Tenant) -> None:
    connection.set_tenant(tenant_a)
    _next_request()
    _sent_and_path()
    connection.set_tenant(tenant_b)  # no health check now: django-tenants' own SET
    sent, path = _sent_and_path()
    assert sent[0].startswith("SET search_path") and tenant_b.schema_name in path


def test_a_connection_that_died_between_requests_is_replaced_with_the_path_set(live_tenant: Tenant) -> None:
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid

    def terminate() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
        finally:
            connections.close_all()

    killer = threading.Thread(target=terminate)
    killer.start()
    killer.join()
    _next_request()
    sent, path = _sent_and_path()  # would raise on the dead session without the check
    assert connection.connection.info.backend_pid != backend
    assert live_tenant.schema_name in path and sent[-1] == "SELECT current_setting('search_path')"
