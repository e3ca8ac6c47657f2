"""A persistent connection across requests and tenants (fastpath.backend, django-tenants'
backend underneath): whatever happened to the connection before, the next request's
statements run on its own tenant's search_path."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from tenants.models import Tenant
from tests.pooler import server_pid


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
def test_within_a_request_a_tenant_switch_still_sets_the_path(tenant_a: Tenant, tenant_b: Tenant) -> None:
    connection.set_tenant(tenant_a)
    _next_request()
    _sent_and_path()
    connection.set_tenant(tenant_b)  # no health check now: django-tenants' own SET
    sent, path = _sent_and_path()
    assert sent[0].startswith("SET search_path") and tenant_b.schema_name in path


@pytest.mark.proof
def test_a_connection_that_died_between_requests_is_replaced_with_the_path_set(live_tenant: Tenant) -> None:
    backend = server_pid()

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
    assert server_pid() != backend
    assert live_tenant.schema_name in path and sent[-1] == "SELECT current_setting('search_path')"


def test_a_request_that_ended_in_an_error_leaves_no_path_for_the_next_tenant(live_tenant: Tenant, tenant_b: Tenant) -> None:
    """A request for tenant A ends after a database error: Django health-checks the
    connection then, which sets A's path. The next request is tenant B's, and its queries
    must run in B."""
    connection.set_tenant(live_tenant)
    _sent_and_path()
    connection.close_at = None  # a persistent connection (tests otherwise close at once)
    connection.errors_occurred = True
    connection.close_if_unusable_or_obsolete()  # request_finished
    assert connection.connection is not None and live_tenant.schema_name in connection.search_path_set_schemas
    connection.close_if_unusable_or_obsolete()  # request_started
    connection.set_schema_to_public()  # the tenant middleware
    connection.set_tenant(tenant_b)
    _, path = _sent_and_path()
    assert tenant_b.schema_name in path and live_tenant.schema_name not in path


def test_a_path_set_by_a_check_in_a_transaction_that_rolls_back_is_set_again(live_tenant: Tenant, tenant_b: Tenant) -> None:
    """A check that ran inside a transaction (or savepoint) that then rolled back took its
    SET with it; the next cursor sets the path again."""
    _checked_in_a_block_that_rolls_back(live_tenant, tenant_b)  # a transaction
    sent, path = _sent_and_path()
    assert sent[0].startswith("SET search_path") and tenant_b.schema_name in path
    with transaction.atomic():
        _checked_in_a_block_that_rolls_back(live_tenant, tenant_b)  # a savepoint
        # django-tenants set it again already, for the RELEASE after the rollback
        assert tenant_b.schema_name in _sent_and_path()[1]


def _checked_in_a_block_that_rolls_back(before: Tenant, inside: Tenant) -> None:
    connection.set_tenant(before)
    _sent_and_path()
    with pytest.raises(RuntimeError), transaction.atomic():
        connection.set_tenant(inside)
        _next_request()
        assert inside.schema_name in _sent_and_path()[1]
        raise RuntimeError
