"""The WSGI handler gunicorn serves: /v1/ requests skip the middleware only a browser uses.

Five middleware in `MIDDLEWARE` serve the Django admin's browser session and nothing on
/v1/: the API authenticates by key (`DEFAULT_AUTHENTICATION_CLASSES` is empty, no view
uses a session), every DRF view is CSRF-exempt, and no API view logs in or adds a message.
On an API request they still ran, each wrapping the next: sessions, CSRF, the session
user, messages and django-axes' lockout check. Skipping them is 2% of a keyed payment's
instructions (docs/BENCHMARKS.md, issue 13, eleventh pass) and changes no /v1/ response
(tests/api/test_api_handler.py compares them header by header).

The two middleware chains are built once, in order, from `MIDDLEWARE`: the API's is the
same list less `BROWSER_ONLY_MIDDLEWARE`. Which one a request takes is decided by
`is_api_path`, the predicate that already decides whether an error is the API's envelope,
on the request Django built; every other path (the admin, health, metrics, static files)
takes the whole chain.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.core.handlers.base import BaseHandler
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponseBase

from payments.api.errors import is_api_path

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


def _chain_with(middleware: Sequence[str]) -> BaseHandler:
    # Django's loader reads settings.MIDDLEWARE and has no other input; it runs once, at
    # start-up, before the process serves anything.
    full = settings.MIDDLEWARE
    settings.MIDDLEWARE = list(middleware)
    try:
        handler = BaseHandler()
        handler.load_middleware()
    finally:
        settings.MIDDLEWARE = full
    return handler


def api_chain() -> BaseHandler:
    """A handler whose `get_response` runs the API's middleware chain."""
    return _chain_with(api_middleware())


class ApiPathSplit(BaseHandler):
    """A handler's `get_response`, sending /v1/ requests down the API's chain (`api`).
    The test client's handler mixes it in too (tests/api/conftest.py), so the API tests
    go through the chain gunicorn runs."""

    api: BaseHandler

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        if is_api_path(request):
            return self.api.get_response(request)
        return super().get_response(request)  # type: ignore[no-any-return]


class ApiSplitHandler(ApiPathSplit, WSGIHandler):
    """Django's WSGI handler with the API's middleware chain for /v1/ requests."""

    def __init__(self) -> None:
        super().__init__()
        self.api = api_chain()
