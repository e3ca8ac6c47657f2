"""The WSGI handler gunicorn serves (config.wsgi): /v1/ requests skip the middleware only a browser uses.

Five middleware in `MIDDLEWARE` serve the Django admin's browser session and nothing on
/v1/: the API authenticates by key (`DEFAULT_AUTHENTICATION_CLASSES` is empty, no view
reads a session), every view under /v1/ is CSRF-exempt (tests/api/test_api_handler.py
walks them), and no API view logs in or adds a message. On an API request they still ran,
each wrapping the next: sessions, CSRF, the session user, messages and django-axes'
lockout check. Skipping them is 2-3% of a keyed payment's instructions
(docs/BENCHMARKS.md, issue 13, eleventh pass). Answers on /v1/ are the same down either
chain, body, headers and cookies (tested), but for what those middleware did for a
browser that the API never uses: the whole chain gave the API docs pages a `csrftoken`
cookie, replaced a malformed CSRF cookie and cleared a malformed session cookie, each with
`Vary: Cookie`.

The API's chain is `MIDDLEWARE` in the same order less `BROWSER_ONLY_MIDDLEWARE`. A request
takes it when its `path_info`, the path Django resolves to a view, is under /v1/; every
other path (the admin, health, metrics, static files) takes the whole chain.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import django.core.handlers.base
from django.conf import settings
from django.core.handlers.base import BaseHandler
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponseBase

BROWSER_ONLY_MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "axes.middleware.AxesMiddleware",
)


def api_middleware() -> list[str]:
    """`MIDDLEWARE` as an API request runs it: in the same order, less the browser's."""
    return [path for path in settings.MIDDLEWARE if path not in BROWSER_ONLY_MIDDLEWARE]


def takes_api_chain(request: HttpRequest) -> bool:
    # path_info, not path: a SCRIPT_NAME of "/v1" in front of "/admin/login/" is the admin.
    return request.path_info.startswith("/v1/") or request.path_info == "/v1"


class _SettingsWithMiddleware:
    """The settings, but for `MIDDLEWARE`: what Django's loader reads for one chain."""

    def __init__(self, middleware: Sequence[str]) -> None:
        self.MIDDLEWARE = list(middleware)

    def __getattr__(self, name: str) -> Any:
        return getattr(settings, name)


def _chain_with(middleware: Sequence[str]) -> BaseHandler:
    """A handler whose middleware chain is `middleware`, built by Django's own loader
    (`BaseHandler.load_middleware`, which reads the list from `settings.MIDDLEWARE` and
    takes no other input). The loader runs with `settings` bound to a view holding this
    list in its globals only, so the real settings, which other threads read, never
    change."""
    loader = BaseHandler.load_middleware
    scoped_globals = {**vars(django.core.handlers.base), "settings": _SettingsWithMiddleware(middleware)}
    load = types.FunctionType(loader.__code__, scoped_globals, loader.__name__, loader.__defaults__, loader.__closure__)
    handler = BaseHandler()
    load(handler)
    return handler


def api_chain() -> BaseHandler:
    """A handler whose `get_response` runs the API's middleware chain."""
    return _chain_with(api_middleware())


class ApiPathSplit(BaseHandler):
    """A handler's `get_response`, sending /v1/ requests down the API's chain (`api`).
    The suite's test client handler mixes it in too (tests/conftest.py), so the tests go
    through the chains gunicorn runs."""

    api: BaseHandler

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        if takes_api_chain(request):
            return self.api.get_response(request)
        return super().get_response(request)


class ApiSplitHandler(ApiPathSplit, WSGIHandler):
    """Django's WSGI handler with the API's middleware chain for /v1/ requests."""

    def __init__(self) -> None:
        super().__init__()
        self.api = api_chain()
