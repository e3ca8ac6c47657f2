"""Fixtures: two session-scoped tenants (committed once per test database), helpers to
run code inside a tenant, and HTTP clients bound to a tenant's host.

Most tests use `tenant` (inside pytest-django's rolled-back transaction). Tests that
race real threads use `live_tenant`: no wrapping transaction, so their rows commit and
other connections see them; they create uniquely-named data and leave it behind in the
throwaway test database.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from django.db import connection, connections
from django.test import Client
from django_tenants.utils import schema_context

from tenants.models import Domain, Tenant
from tenants.services import tenant_create

T = TypeVar("T")

TENANT_A = {"schema_name": "test_a", "domain": "a.test.localhost", "name": "Tenant A", "main_currency": "JPY"}
TENANT_B = {"schema_name": "test_b", "domain": "b.test.localhost", "name": "Tenant B", "main_currency": "EUR", "currency_exponent": 2}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="the fault suite's long form (`make proof`): more faults, longer outages, and the long_only scenarios")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long form only: run with --long (make proof)")
    for item in items:
        if item.get_closest_marker("long_only"):
            item.add_marker(skip)


_FIGURES: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the fault scenarios' figure lines (tests.faults.figures) from their captured
    output, also from xdist's workers, for the summary below."""
    if report.when == "call":
        _FIGURES.extend(line for line in report.capstdout.splitlines() if line.startswith("FIGURES "))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _FIGURES:
        terminalreporter.section("fault scenarios: figures")
        for line in _FIGURES:
            terminalreporter.write_line(line[len("FIGURES "):])


def _public_tenant_ensure() -> None:
    connection.set_schema_to_public()
    public, _ = Tenant.objects.get_or_create(schema_name="public", defaults={"name": "Platform", "main_currency": "XXX"})
    Domain.objects.get_or_create(domain="public.test.localhost", defaults={"tenant": public, "is_primary": True})


@pytest.fixture(autouse=True)
def _payers_forgotten() -> None:
    """Each test starts with no payer's accounts remembered (payments.services.charges):
    its first payment of a payer reads the plan, its next ones do not, whatever ran before;
    and no fee schedule cached (payments.selectors.fee_terms_in_force)."""
    from payments.selectors import fee_terms_forget
    from payments.services.charges import known_accounts_forget

    known_accounts_forget()
    fee_terms_forget()


@pytest.fixture(autouse=True)
def _webhook_connections_fresh() -> Iterator[None]:
    """No test sends on a connection another test's run kept (to a receiver long gone, or
    one a test's TLS context trusted), and a test's receiver sees its connections end."""
    from webhooks.services.deliveries import webhook_kept_connections_close

    webhook_kept_connections_close()
    yield
    webhook_kept_connections_close()


@pytest.fixture(scope="session")
def django_db_setup(
    django_test_environment: None, django_db_blocker: Any, django_db_modify_db_settings: None
) -> Iterator[None]:
    """Create the test database whatever the selected tests are marked with.

    pytest-django only sets up the databases that `django_db`-marked tests name, so a run
    of only `live_tenant` tests would find none.
    """
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default"})
        _public_tenant_ensure()
        for spec in (TENANT_A, TENANT_B):
            if not Tenant.objects.filter(schema_name=spec["schema_name"]).exists():
                tenant_create(**spec)
        # Most tests charge by customer id; tests of the token-only default turn it off.
        Tenant.objects.filter(schema_name__in=[TENANT_A["schema_name"], TENANT_B["schema_name"]]).update(charge_by_customer_id=True)
        connection.set_schema_to_public()
    yield
    with django_db_blocker.unblock():
        connections.close_all()
        teardown_databases(db_cfg, verbosity=0)


@pytest.fixture(scope="session")
def tenant_a(django_db_setup: None, django_db_blocker: Any) -> Tenant:
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        return Tenant.objects.get(schema_name=TENANT_A["schema_name"])


@pytest.fixture(scope="session")
def tenant_b(django_db_setup: None, django_db_blocker: Any) -> Tenant:
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        return Tenant.objects.get(schema_name=TENANT_B["schema_name"])


@pytest.fixture
def tenant(db: None, tenant_a: Tenant) -> Iterator[Tenant]:
    """Tenant A's schema for the test, inside the test's rolled-back transaction."""
    connection.set_tenant(tenant_a)
    yield tenant_a
    connection.set_schema_to_public()


@pytest.fixture
def live_tenant(django_db_setup: None, django_db_blocker: Any, tenant_a: Tenant) -> Iterator[Tenant]:
    """Tenant A with real commits, for tests that race threads or processes."""
    with django_db_blocker.unblock():
        connection.set_tenant(tenant_a)
        yield tenant_a
        connection.set_schema_to_public()


@contextmanager
def in_tenant(tenant: Tenant) -> Iterator[None]:
    """Run a block inside `tenant`'s schema, restoring the previous schema after."""
    with schema_context(tenant.schema_name):
        yield


def statements_sent(fn: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Each statement string `fn` sends through Django's connection, with its parameters."""
    sent: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        fn()
    return sent


def run_in_thread_tenant(tenant: Tenant, fn: Callable[[], T]) -> T:
    """Body for a worker thread: its own connection, set to `tenant`, closed after."""
    try:
        connection.set_tenant(tenant)
        return fn()
    finally:
        connections.close_all()


def in_background(tenant: Tenant, fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `fn` in `tenant` on a started daemon thread; its result or exception lands in the
    returned box ("result" or "error") for the test's asserts."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = run_in_thread_tenant(tenant, fn)
        except BaseException as exc:  # surfaced by the test's asserts
            box["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


@pytest.fixture
def tenant_client(tenant: Tenant) -> Client:
    return Client(HTTP_HOST=TENANT_A["domain"])


def host_of(tenant: Tenant) -> str:
    return str(tenant.get_primary_domain().domain)


@pytest.fixture(scope="session")
def psp_simulator() -> Iterator[Any]:
    """The real PSP simulator process (devtools/psp_simulator.py), one per test session."""
    from tests.psp_sim import simulator_running

    with simulator_running() as sim:
        yield sim


def psp_account_configure(sim: Any, *, webhook_secrets: list[str] | None = None) -> str:
    """Make the simulator the current tenant's active card gateway, under a fresh account
    (API key) of its own; returns that key."""
    import uuid

    from payments.services.topups import gateway_account_set

    api_key = f"sk_sim_{uuid.uuid4().hex}"
    gateway_account_set(gateway="simulator", api_base=sim.url, secret_key=api_key, webhook_secrets=webhook_secrets or ["whsec_test_1"])
    return api_key


@pytest.fixture
def loopback_http(settings: Any) -> None:
    """The tests' webhook receivers listen on 127.0.0.1 over plain http (as `make run`'s does)."""
    settings.TALLY_WEBHOOK_ALLOW_HTTP = True
    settings.TALLY_WEBHOOK_ALLOW_LOOPBACK = True


@pytest.fixture(scope="session")
def payouts_tenant_committed(django_db_setup: None, django_db_blocker: Any) -> Tenant:
    from tests.payouts_support import PAYOUTS_TENANT

    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        tenant = Tenant.objects.filter(schema_name=PAYOUTS_TENANT["schema_name"]).first() or tenant_create(**PAYOUTS_TENANT)
        connection.set_schema_to_public()
        return tenant


@pytest.fixture
def payouts_world(
    payouts_tenant_committed: Tenant, psp_simulator: Any, settings: Any, django_db_blocker: Any
) -> Iterator[Any]:
    """The payouts tenant with real commits (as `live_tenant`), the simulator its gateway
    (tests/payouts_support.py)."""
    from tests.payouts_support import WEBHOOK_SECRET, World
    from tests.receivers import receiver_running
    from wallets.services.principals import staff_member_get_or_create

    settings.TALLY_PSP_TIMEOUT_SECONDS = 1.0
    settings.TALLY_PAYOUT_LEASE_SECONDS = 2
    settings.TALLY_OUTBOX_RELAY_KICK = False
    psp_simulator.faults_clear()
    psp_simulator.faults(payouts_manual=True)  # a payout stays in transit until the test settles it
    with django_db_blocker.unblock():
        connection.set_tenant(payouts_tenant_committed)
        try:
            psp_key = psp_account_configure(psp_simulator, webhook_secrets=[WEBHOOK_SECRET])
            staff = staff_member_get_or_create(username=f"payouts-{uuid.uuid4().hex[:8]}")
            with receiver_running() as receiver:
                psp_simulator.webhook_endpoint(psp_key, receiver.url(), WEBHOOK_SECRET)
                yield World(sim=psp_simulator, psp_key=psp_key, staff=staff, receiver=receiver)
        finally:
            psp_simulator.faults_clear()
            connection.set_schema_to_public()
