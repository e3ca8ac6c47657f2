"""/healthz, /readyz and /metrics, answered on every host before tenant routing."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound

from config import metrics
from config.observability import Middleware


def _check(probe: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    """{"ok": True} plus what `probe` adds, or the name of what it raised: readiness reports any failure."""
    try:
        return {"ok": True, **(probe() or {})}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": type(exc).__name__}


def _database() -> None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")


def _redis() -> None:
    redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5).ping()


def _migrations() -> dict[str, Any]:
    connection = connections[DEFAULT_DB_ALIAS]
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return {"ok": not plan, "pending": len(plan)}


def readiness() -> tuple[bool, dict[str, Any]]:
    checks = {"database": _check(_database), "redis": _check(_redis)}
    checks["migrations"] = _check(_migrations) if checks["database"]["ok"] else {"ok": False, "error": "database"}
    return all(c["ok"] for c in checks.values()), checks


class HealthMiddleware(Middleware):
    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path == "/healthz":
            return HttpResponse(b'{"status":"ok"}', content_type="application/json")
        if path == "/readyz":
            ready, checks = readiness()
            body = json.dumps({"status": "ready" if ready else "not_ready", "checks": checks})
            return HttpResponse(body, status=200 if ready else 503, content_type="application/json")
        if path == "/metrics":
            if not metrics_allowed(request):
                return HttpResponseNotFound(b"Not found", content_type="text/plain")
            payload, content_type = metrics.render()
            return HttpResponse(payload, content_type=content_type)
        return self.get_response(request)


def metrics_allowed(request: HttpRequest) -> bool:
    """/metrics (platform-wide counters, every tenant's schema name) opens to the bearer token
    TALLY_METRICS_TOKEN, or outside production (TALLY_METRICS_ON_PLATFORM_HOST) on the platform
    host: anyone can send its Host header. Elsewhere it does not exist (404)."""
    token = getattr(settings, "TALLY_METRICS_TOKEN", "")
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return True
    if not getattr(settings, "TALLY_METRICS_ON_PLATFORM_HOST", False):
        return False
    try:
        host = request.get_host().rsplit(":", 1)[0].lower()
    except DisallowedHost:
        return False
    return host == str(settings.TALLY_PUBLIC_DOMAIN).lower()
