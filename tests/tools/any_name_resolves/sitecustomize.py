"""Loaded by the live schemathesis run's gunicorn (on its PYTHONPATH): a host name that does
not resolve resolves to 127.0.0.1. Registration refuses a webhook URL whose name does not
resolve, a rule no schema can state; the names schemathesis makes up never do. Loopback is
allowed under the server's settings (config.settings.local), and nothing listens on 443."""

from __future__ import annotations

import socket
from typing import Any

_resolve = socket.getaddrinfo


def _any_name_resolves(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return _resolve(host, port, *args, **kwargs)
    except socket.gaierror:
        return _resolve("127.0.0.1", port, *args, **kwargs)


socket.getaddrinfo = _any_name_resolves
