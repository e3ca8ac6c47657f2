"""The served application's two middleware chains (config.handlers).

/v1/ requests skip the five middleware only the admin's browser session uses; every other
path runs all of MIDDLEWARE. The whole suite's test clients already take the same split
(tests/conftest.py); these tests check the split itself: which requests take which chain,
that the admin keeps its session and CSRF protection through the WSGI application gunicorn
serves, and that an API answer is the same down either chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client, RequestFactory

from config.handlers import BROWSER_ONLY_MIDDLEWARE, ApiSplitHandler, api_middleware
from tests.api.conftest import Api, World
from tests.conftest import TENANT_A, DjangoClientHandler


def test_the_api_chain_is_all_middleware_less_the_browsers_in_the_same_order() -> None:
    assert set(BROWSER_ONLY_MIDDLEWARE) <= set(settings.MIDDLEWARE)  # a renamed one would silently stay
    assert api_middleware() == [path for path in settings.MIDDLEWARE if path not in BROWSER_ONLY_MIDDLEWARE]
    assert len(api_middleware()) == len(settings.MIDDLEWARE) - len(BROWSER_ONLY_MIDDLEWARE)


@pytest.fixture
def served() -> Iterator[ApiSplitHandler]:
    """The application config.wsgi serves, called in-process inside the test's transaction
    (whose connection Django's per-request connection check would close, as the test
    client also avoids)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield ApiSplitHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _call(app: ApiSplitHandler, method: str, path: str, **extra: Any) -> tuple[int, dict[str, list[str]], bytes]:
    factory = RequestFactory(HTTP_HOST=TENANT_A["domain"])
    environ = getattr(factory, method.lower())(path, **extra).environ
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        started.append((int(status.split()[0]), headers))

    response = app(environ, start_response)
    body = b"".join(response)
    response.close()
    status, headers = started[0]
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value)
    return status, by_name, body


@pytest.fixture
def sessions_opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    process_request = SessionMiddleware.process_request

    def counted(self: SessionMiddleware, request: Any) -> None:
        opened.append(request.path)
        process_request(self, request)

    monkeypatch.setattr(SessionMiddleware, "process_request", counted)
    return opened


def test_v1_skips_the_browsers_middleware_and_the_admin_runs_it(tenant: Any, served: ApiSplitHandler, sessions_opened: list[str]) -> None:
    status, headers, body = _call(served, "GET", "/v1/customer/wallet")
    assert status == 401 and body.startswith(b'{"error":')
    status, _, _ = _call(served, "GET", "/v1")
    assert status == 404
    assert sessions_opened == []
    status, headers, _ = _call(served, "GET", "/admin/login/")
    assert status == 200
    assert sessions_opened == ["/admin/login/"]
    assert any(cookie.strip().startswith("csrftoken=") for cookie in headers.get("set-cookie", []))  # CSRF ran on the admin
    _call(served, "GET", "/v1x")  # not an API path: the whole chain
    assert sessions_opened == ["/admin/login/", "/v1x"]


def test_the_served_admin_still_refuses_a_post_without_its_csrf_token(tenant: Any, served: ApiSplitHandler) -> None:
    status, _, body = _call(served, "POST", "/admin/login/", data={"username": "ops", "password": "x"})
    assert status == 403 and b"CSRF" in body


def test_the_test_client_takes_the_same_split(tenant: Any) -> None:
    client = Client(HTTP_HOST=TENANT_A["domain"])
    assert not hasattr(client.get("/v1/customer/wallet").wsgi_request, "session")
    assert hasattr(client.get("/admin/login/").wsgi_request, "session")


def _whole_chain(host: str) -> Api:
    api = Api(host)
    api.client.handler = DjangoClientHandler(enforce_csrf_checks=False)
    return api


def test_an_api_answer_is_the_same_down_either_chain(api: Api, world: World) -> None:
    whole = _whole_chain(world.host)
    assert type(whole.client.handler) is DjangoClientHandler and type(api.client.handler) is not DjangoClientHandler
    for method, path, key, body in [
        ("GET", "/v1/customer/wallet", world.customer.key, None),
        ("GET", "/v1/customer/wallet", None, None),
        ("GET", "/v1/nowhere", world.customer.key, None),
        ("POST", "/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 10**12}),
        ("POST", "/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY"}),
    ]:
        lean = api.call(method, path, key, body, idem="same-either-chain-lean")
        full = whole.call(method, path, key, body, idem="same-either-chain-full")
        assert lean.status_code == full.status_code, (path, lean.content, full.content)
        assert lean.content.replace(lean["Request-Id"].encode(), b"") == full.content.replace(full["Request-Id"].encode(), b"")
        assert {k: v for k, v in lean.items() if k != "Request-Id"} == {k: v for k, v in full.items() if k != "Request-Id"}
        assert not hasattr(lean.wsgi_request, "session") and hasattr(full.wsgi_request, "session")
