"""Fixtures for the HTTP API: a small world of principals with keys in tenant A, a second
merchant/customer in A (for "another principal's object"), and a mirror in tenant B."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.test import Client

from tenants.models import Tenant
from tests.conftest import TENANT_A, TENANT_B, in_tenant, psp_account_configure
from wallets.models import Customer, Merchant, StaffMember, Store, Terminal
from wallets.services.principals import (
    api_key_create,
    customer_create,
    merchant_create,
    staff_member_get_or_create,
    store_create,
    terminal_create,
)


@dataclass
class Party:
    obj: Any
    key: str

    @property
    def id(self) -> str:
        return str(self.obj.pk)


@dataclass
class World:
    host: str
    staff: Party
    customer: Party
    customer2: Party
    merchant: Party
    merchant2: Party
    store: Store
    store2: Store
    terminal: Party
    terminal2: Party  # merchant2's terminal
    terminal_same_merchant_other_store: Party
    extra: dict[str, Any] = field(default_factory=dict)


def _world(host: str, suffix: str) -> World:
    staff = staff_member_get_or_create(username=f"ops-{suffix}-{uuid.uuid4().hex[:8]}")
    # The world's staff key may do everything (as the demo `admin`); the roles have their
    # own tests (tests/api/test_staff_roles.py).
    staff.user.is_superuser = True
    staff.user.save(update_fields=["is_superuser"])
    c1 = customer_create(name=f"Alice {suffix}", email="alice@example.com", phone="+81 90 1234 5678")
    c2 = customer_create(name=f"Bob {suffix}")
    m1 = merchant_create(name=f"Cafe {suffix}")
    m2 = merchant_create(name=f"Bakery {suffix}")
    s1 = store_create(merchant=m1, name="Main street")
    s1b = store_create(merchant=m1, name="Station")
    s2 = store_create(merchant=m2, name="Harbour")
    t1 = terminal_create(store=s1, name="Till 1")
    t1b = terminal_create(store=s1b, name="Till 2")
    t2 = terminal_create(store=s2, name="Till 9")

    def party(obj: Customer | Merchant | Terminal | StaffMember) -> Party:
        return Party(obj=obj, key=api_key_create(principal=obj)[1])

    return World(
        host=host, staff=party(staff), customer=party(c1), customer2=party(c2), merchant=party(m1), merchant2=party(m2),
        store=s1, store2=s2, terminal=party(t1), terminal2=party(t2), terminal_same_merchant_other_store=party(t1b),
    )


@pytest.fixture
def world(tenant: Tenant, psp_simulator: Any) -> World:
    made = _world(TENANT_A["domain"], "a")
    made.extra["psp_api_key"] = psp_account_configure(psp_simulator)  # card top-ups charge the real simulator
    return made


@pytest.fixture
def world_b(world: World, tenant_b: Tenant, tenant: Tenant) -> Iterator[World]:
    with in_tenant(tenant_b):
        other = _world(TENANT_B["domain"], "b")
    connection.set_tenant(tenant)
    yield other


class Api:
    """HTTP calls to a tenant's host with a bearer key; POSTs get a fresh Idempotency-Key."""

    def __init__(self, host: str, *, raise_request_exception: bool = True) -> None:
        self.client = Client(HTTP_HOST=host, raise_request_exception=raise_request_exception)

    def call(self, method: str, path: str, key: str | None, body: Any = None, *, idem: str | None = "auto",
             content_type: str = "application/json", raw: bytes | str | None = None, **headers: str) -> Any:
        extra: dict[str, str] = {}
        if key is not None:
            extra["HTTP_AUTHORIZATION"] = f"Bearer {key}"
        if method == "POST" and idem is not None:
            extra["HTTP_IDEMPOTENCY_KEY"] = uuid.uuid4().hex if idem == "auto" else idem
        for name, value in headers.items():
            extra["HTTP_" + name.upper().replace("-", "_")] = value
        fn = getattr(self.client, method.lower())
        if method in ("GET", "DELETE", "HEAD", "OPTIONS"):
            return fn(path, body or {}, **extra)
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return fn(path, data=data, content_type=content_type, **extra)

    def get(self, path: str, key: str | None, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        return self.call("GET", path, key, params, **kw)

    def post(self, path: str, key: str | None, body: Any = None, **kw: Any) -> Any:
        return self.call("POST", path, key, body, **kw)


@pytest.fixture
def api(world: World) -> Api:
    return Api(world.host)


@pytest.fixture
def api_b(world_b: World) -> Api:
    return Api(world_b.host)


def error_of(response: Any) -> dict[str, Any]:
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "code", "message", "param", "request_id"}, body
    assert body["error"]["request_id"] == response["Request-Id"]
    return dict(body["error"])


@pytest.fixture
def connection_kept_across_requests() -> Iterator[None]:
    """WSGI requests made in-process run on the test's connection and inside its
    transaction: like the test client, stop the request signals from closing the
    connection between requests."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def throttle_clock_held(monkeypatch: pytest.MonkeyPatch) -> float:
    """The throttles' clock (apikit.throttling) held at the moment the test starts. Their
    windows are fixed on the wall clock, so a test's requests that straddled a window's
    end (a minute's, or a second's) were counted in two windows and the limit never met,
    however fast the machine. Also forgets a fail-open an earlier test left running."""
    from apikit import throttling

    now = time.time()
    monkeypatch.setattr(throttling, "time", SimpleNamespace(time=lambda: now))
    monkeypatch.setattr(throttling, "_redis_down_until", 0.0)
    return now
