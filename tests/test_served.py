"""Served like production: gunicorn + whitenoise answer the admin's CSS from the
collected STATIC_ROOT, and the API docs load their assets from us, not from a CDN."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import TENANT_A
from tests.live import gunicorn_running, static_collect


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


def test_gunicorn_serves_the_admin_css_and_the_docs_assets(django_db_setup: None, tmp_path: Path) -> None:
    static_root = tmp_path / "static"
    static_collect(static_root=static_root)
    assert (static_root / "admin/css/base.css").exists()
    with gunicorn_running(static_root=static_root) as port:
        status, content_type, body = _get(port, "/static/admin/css/base.css")
        assert status == 200 and content_type.startswith("text/css") and b"body" in body
        status, content_type, _ = _get(port, "/static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js")
        assert status == 200 and "javascript" in content_type
        status, _, _ = _get(port, "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
        assert status == 200


@pytest.mark.django_db
def test_the_api_docs_load_no_cdn(tenant_a: object) -> None:
    client = Client(HTTP_HOST=TENANT_A["domain"])
    for path in ("/v1/docs", "/v1/docs/swagger"):
        page = client.get(path)
        assert page.status_code == 200, path
        html = page.content.decode()
        assert "/static/drf_spectacular_sidecar/" in html
        assert "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html, html
