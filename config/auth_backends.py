"""Authentication backends wired by settings (AUTHENTICATION_BACKENDS)."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.http import HttpRequest


class LoginThrottleBackend(AxesStandaloneBackend):  # type: ignore[misc]  # django-axes is untyped
    """django-axes' lockout check for every login with a request (the admin's form, on every
    host); one without (a shell, a test client's `login()`) has no address to throttle."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any) -> None:
        if request is None:
            return None
        super().authenticate(request, username=username, password=password, **kwargs)
        return None
