"""The served application's two middleware chains (fastpath.handlers).

/v1/ requests skip the five middleware only the admin's browser session uses; every other
path runs all of MIDDLEWARE. The whole suite's test clients already take the same split
(tests/conftest.py); these tests check the split itself: which requests take which chain,
that every view the API chain can reach is CSRF-exempt, that building a chain leaves the
settings alone, and that an API answer is the same down either chain.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from axes.middleware import AxesMiddleware
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver

from fastpath.handlers import BROWSER_ONLY_MIDDLEWARE, ApiSplitHandler, _chain_with, api_middleware
from tests.api.conftest import Api, World
from tests.conftest import TENANT_A, DjangoClientHandler


def test_the_api_chain_is_all_middleware_less_the_browsers_in_the_same_order() -> None:
    chain = api_middleware()
    assert set(settings.MIDDLEWARE) - set(chain) == set(BROWSER_ONLY_MIDDLEWARE)  # a renamed one would silently stay
    assert len(chain) == len(settings.MIDDLEWARE) - 5
    positions = [settings.MIDDLEWARE.index(path) for path in chain]
    assert positions == sorted(positions)


@pytest.fixture
def served(connection_kept_across_requests: None) -> ApiSplitHandler:
    """The application config.wsgi serves, called in-process inside the test's transaction."""
    return ApiSplitHandler()


def _call(app: ApiSplitHandler, method: str, path: str, *, script_name: str = "", **extra: Any) -> tuple[int, dict[str, list[str]], bytes]:
    environ = getattr(RequestFactory(HTTP_HOST=TENANT_A["domain"]), method.lower())(path, **extra).environ
    environ["SCRIPT_NAME"] = script_name
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        started.append((int(status.split()[0]), headers))

    response = app(environ, start_response)
    body = b"".join(response)
    response.close()
    status, headers = started[0]
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value.strip())
    return status, by_name, body


@pytest.fixture
def browser_middleware_ran(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(middleware, request path) for each of the five, each time it runs."""
    ran: list[tuple[str, str]] = []

    def spy(cls: type, name: str) -> None:
        original = getattr(cls, name)

        def counted(self: Any, request: Any, *args: Any) -> Any:
            ran.append((cls.__name__, request.path))
            return original(self, request, *args)

        monkeypatch.setattr(cls, name, counted)

    for cls in (SessionMiddleware, CsrfViewMiddleware, AuthenticationMiddleware, MessageMiddleware):
        spy(cls, "process_request")
    spy(AxesMiddleware, "__call__")
    return ran


FIVE = {"SessionMiddleware", "CsrfViewMiddleware", "AuthenticationMiddleware", "MessageMiddleware", "AxesMiddleware"}


def test_v1_skips_the_browsers_middleware_and_the_admin_runs_all_five(
    tenant: Any, served: ApiSplitHandler, browser_middleware_ran: list[tuple[str, str]]
) -> None:
    status, _, body = _call(served, "GET", "/v1/customer/wallet")
    assert status == 401 and body.startswith(b'{"error":')
    assert _call(served, "GET", "/v1")[0] == 404
    assert browser_middleware_ran == []
    status, headers, _ = _call(served, "GET", "/admin/login/")
    assert status == 200
    assert {name for name, _ in browser_middleware_ran} == FIVE
    assert any(cookie.startswith("csrftoken=") for cookie in headers.get("set-cookie", []))
    browser_middleware_ran.clear()
    _call(served, "GET", "/v1x")  # not under /v1/: the whole chain
    assert {name for name, _ in browser_middleware_ran} == FIVE


def test_a_script_name_of_v1_does_not_send_the_admin_down_the_api_chain(
    tenant: Any, served: ApiSplitHandler, browser_middleware_ran: list[tuple[str, str]]
) -> None:
    # gunicorn takes SCRIPT_NAME from a trusted proxy's header; Django resolves PATH_INFO.
    status, headers, _ = _call(served, "GET", "/admin/login/", script_name="/v1")
    assert status == 200
    assert {name for name, _ in browser_middleware_ran} == FIVE
    assert any(cookie.startswith("csrftoken=") for cookie in headers.get("set-cookie", []))


def test_the_served_admin_still_refuses_a_post_without_its_csrf_token(tenant: Any, served: ApiSplitHandler) -> None:
    status, _, body = _call(served, "POST", "/admin/login/", data={"username": "ops", "password": "x"})
    assert status == 403 and b"CSRF" in body


def _views(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _views(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


def test_every_view_the_api_chain_can_reach_is_csrf_exempt() -> None:
    """Without CSRF middleware on /v1/, a form view there would lose its protection: a new
    view under /v1/ must be exempt (DRF's are) or the split must change."""
    reachable = [(route, view) for route, view in _views(get_resolver(settings.ROOT_URLCONF).url_patterns) if route.startswith(("v1", "^v1"))]
    assert len(reachable) > 20
    assert [route for route, view in reachable if not getattr(view, "csrf_exempt", False)] == []


def test_building_a_chain_leaves_the_settings_alone() -> None:
    whole = list(settings.MIDDLEWARE)
    seen: set[int] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(len(settings.MIDDLEWARE))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        builders = [threading.Thread(target=lambda: [_chain_with(api_middleware()) for _ in range(5)]) for _ in range(4)]
        for builder in builders:
            builder.start()
        for builder in builders:
            builder.join()
    finally:
        stop.set()
        reader.join()
    assert seen == {len(whole)} and settings.MIDDLEWARE == whole


def test_the_test_client_takes_the_same_split(tenant: Any) -> None:
    client = Client(HTTP_HOST=TENANT_A["domain"])
    assert not hasattr(client.get("/v1/customer/wallet").wsgi_request, "session")
    assert hasattr(client.get("/admin/login/").wsgi_request, "session")


def _whole_chain(host: str) -> Api:
    api = Api(host)
    api.client.handler = DjangoClientHandler(enforce_csrf_checks=False)
    return api


def _headers_and_cookies(response: Any) -> tuple[dict[str, str], dict[str, str]]:
    headers = {name: value for name, value in response.items() if name != "Request-Id"}
    return headers, {name: morsel.OutputString() for name, morsel in response.cookies.items()}


def test_an_api_answer_is_the_same_down_either_chain(api: Api, world: World) -> None:
    whole = _whole_chain(world.host)
    assert type(whole.client.handler) is DjangoClientHandler and type(api.client.handler) is not DjangoClientHandler
    for method, path, key, body, extra in [
        ("GET", "/v1/customer/wallet", world.customer.key, None, {}),
        ("GET", "/v1/customer/wallet", None, None, {}),
        ("GET", "/v1/nowhere", world.customer.key, None, {}),
        ("GET", "/v1/schema", None, None, {}),
        ("POST", "/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 10**12}, {}),
        ("POST", "/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY"}, {}),
        ("GET", "/v1/customer/wallet", world.customer.key, None, {"Cookie": f"csrftoken={'a' * 32}; sessionid={'b' * 32}"}),
    ]:
        lean = api.call(method, path, key, body, idem="same-either-chain-lean", **extra)
        full = whole.call(method, path, key, body, idem="same-either-chain-full", **extra)
        assert lean.status_code == full.status_code, (path, lean.content, full.content)
        assert lean.content.replace(lean["Request-Id"].encode(), b"") == full.content.replace(full["Request-Id"].encode(), b"")
        assert _headers_and_cookies(lean) == _headers_and_cookies(full), path
        assert not hasattr(lean.wsgi_request, "session") and hasattr(full.wsgi_request, "session")


def test_malformed_browser_cookies_sent_to_the_api_are_left_alone(api: Api, world: World) -> None:
    """The API answers that differ: the whole chain replaces a malformed CSRF cookie and
    clears a malformed session cookie (and says the answer varies by cookie); the API
    uses neither, so it no longer answers about them."""
    cookies = "csrftoken=abc; sessionid=abc"
    lean = api.get("/v1/customer/wallet", world.customer.key, Cookie=cookies)
    full = _whole_chain(world.host).get("/v1/customer/wallet", world.customer.key, Cookie=cookies)
    assert lean.status_code == full.status_code == 200 and lean.content == full.content
    (lean_headers, lean_cookies), (full_headers, full_cookies) = _headers_and_cookies(lean), _headers_and_cookies(full)
    assert lean_cookies == {}
    assert sorted(full_cookies) == ["csrftoken", "sessionid"] and full_cookies["sessionid"].startswith('sessionid=""')
    assert full_headers.pop("Vary") == "Cookie" and lean_headers == full_headers
