"""Served like production: gunicorn + whitenoise answer the admin's CSS from the
collected STATIC_ROOT, and the API docs load their assets from us, not from a CDN."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.test import Client

from tenants.models import Tenant
from tests.conftest import TENANT_A
from tests.live import gunicorn_running, static_collect
from wallets.services.principals import api_key_create, api_key_revoke, customer_create


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


def _wallet_status(port: int, key: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/customer/wallet",
                                     headers={"Host": TENANT_A["domain"], "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_a_served_worker_reads_this_xdist_workers_redis(live_tenant: Tenant) -> None:
    """A key this process revokes ends at once in the server's cache: the server reads the
    API key epoch (and the throttle windows) in the Redis database this xdist worker uses
    (config/settings/test.py). It used to read the base REDIS_URL, a database shared by
    both workers' servers, which this process's epoch bump never reached."""
    customer = customer_create(name=f"Served {uuid.uuid4().hex[:8]}")
    row, raw = api_key_create(principal=customer)
    with gunicorn_running(TALLY_API_KEY_CACHE_SECONDS="60") as port:
        assert _wallet_status(port, raw) == 200  # cached in the server's one worker
        api_key_revoke(api_key=row)  # committed, then the epoch bumped
        assert _wallet_status(port, raw) == 401
