"""The per-process cache of live API keys (wallets.keycache, TALLY_API_KEY_CACHE_SECONDS)
and the per-tenant API key epoch that keeps it correct across processes (fastpath.epochs).

A key revoked or rotated through the services stops working on the next request in every
process: here, in the process that did it, and (the tests with `_in_another_process`) in
this one when a separate Python process ran the service, so nothing it did touched this
process's memory: only PostgreSQL and Redis carry the change. A change with no epoch bump
(the row written with QuerySet.update: what a bump Redis did not take leaves behind) ends
within the TTL. Redis down: nothing is cached, every request asks PostgreSQL. Keys and
epochs are per tenant schema: a cached key of tenant A never opens tenant B.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from apikit import throttling
from fastpath import epochs
from idempotency.models import IdempotencyRecord
from payments.models import PaymentToken
from tenants.models import Tenant
from tests.api.conftest import Api, World, error_of
from tests.conftest import TENANT_A, TENANT_B
from wallets.keycache import api_key_epoch_bump
from wallets.metrics import API_KEY_EPOCH_BUMP_FAILURES
from wallets.models import ApiKey, Customer
from wallets.services.principals import api_key_create, api_key_revoke, api_key_rotate, customer_create

WALLET = "/v1/customer/wallet"


def _key_row(world: World) -> ApiKey:
    return ApiKey.objects.get(customer=world.customer.obj)


class KeyClock:
    """This process's wall clock (django.utils.timezone.now: what a key's expiry is checked
    against, in the cache and in the database read) held where a test puts it. The
    cache's own TTL runs on time.monotonic and is untouched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def hold(self, moment: datetime) -> None:
        self._monkeypatch.setattr(timezone, "now", lambda: moment)


@pytest.fixture
def key_clock(monkeypatch: pytest.MonkeyPatch) -> KeyClock:
    return KeyClock(monkeypatch)


def test_a_change_without_an_epoch_bump_is_seen_within_the_ttl(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 0.5
    started = time.monotonic()  # before the entry's deadline is set: a hit below 0.5 s of this is inside its TTL
    assert api.get(WALLET, world.customer.key).status_code == 200  # now cached
    ApiKey.objects.filter(pk=_key_row(world).pk).update(revoked_at=timezone.now())  # as a write whose bump was lost
    still = api.get(WALLET, world.customer.key)
    if time.monotonic() - started < 0.5:  # the cache answered: proof that it is in use
        assert still.status_code == 200
    time.sleep(0.6)
    denied = api.get(WALLET, world.customer.key)
    assert denied.status_code == 401 and error_of(denied)["code"] == "api_key_invalid"


def test_revoked_through_the_service_stops_at_once(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    assert api.get(WALLET, world.customer.key).status_code == 200
    api_key_revoke(api_key=_key_row(world))
    assert api.get(WALLET, world.customer.key).status_code == 401


def test_rotated_with_no_overlap_stops_at_once(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    assert api.get(WALLET, world.customer.key).status_code == 200
    _, new_raw = api_key_rotate(api_key=_key_row(world), issuer=world.staff.obj.user, overlap=timedelta(0))
    assert api.get(WALLET, world.customer.key).status_code == 401
    assert api.get(WALLET, new_raw).status_code == 200


def test_a_cached_key_stops_when_its_overlap_ends(api: Api, world: World, settings: Any, key_clock: KeyClock) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    old = _key_row(world)
    key_clock.hold(timezone.now())  # the 3 s overlap cannot run out before the request below, however slow the machine
    api_key_rotate(api_key=old, issuer=world.staff.obj.user, overlap=timedelta(seconds=3))
    assert api.get(WALLET, world.customer.key).status_code == 200  # cached with its expires_at
    expires_at = old.expires_at
    assert expires_at is not None
    key_clock.hold(expires_at + timedelta(milliseconds=100))
    assert api.get(WALLET, world.customer.key).status_code == 401  # within the cache's 60 s: the expiry ended it


def test_a_cached_key_of_one_tenant_never_opens_another(
    api: Api, api_b: Api, world: World, world_b: World, settings: Any
) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    assert api.get(WALLET, world.customer.key).status_code == 200
    assert api.get(WALLET, world.customer.key).status_code == 200  # a cache hit
    assert api_b.get(WALLET, world.customer.key).status_code == 401
    assert api_b.get(WALLET, world_b.customer.key).status_code == 200
    assert api.get(WALLET, world_b.customer.key).status_code == 401


def test_cache_hits_are_copies(api: Api, world: World, settings: Any) -> None:
    from wallets.keycache import api_key_cache_fill, api_key_cache_get

    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    first = api_key_cache_fill(raw_key=world.customer.key)
    assert first is not None and first.customer is not None
    first.customer.name = "changed in one request only"
    second = api_key_cache_get(raw_key=world.customer.key)
    assert second is not None and second.api_key.customer is not None
    assert second.api_key is not first and second.api_key.customer.name == world.customer.obj.name


# --- Across processes: the tenant's API key epoch ---------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
TOKENS = "/v1/customer/payment_tokens"
KEY_LOOKUP = '"wallets_apikey"."key_hash" = %s'  # the key read by its hash


@contextmanager
def _auth_statements() -> Iterator[list[str]]:
    """The key lookups (by hash) this connection runs inside the block."""
    seen: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if KEY_LOOKUP in sql:
            seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        yield seen


def _in_another_process(code: str, *, schema: str = TENANT_A["schema_name"]) -> None:
    """Run `code` (with `ApiKey` and the principal services imported) in a separate Python
    process inside `schema`, on this test database and this Redis: the change it makes
    reaches this process only through PostgreSQL and Redis."""
    script = "\n".join([
        "import django", "django.setup()", "from datetime import timedelta",
        "from django_tenants.utils import schema_context", "from wallets.models import ApiKey",
        "from wallets.services.principals import api_key_revoke, api_key_rotate",
        "from django.contrib.auth.models import User", "superuser = User(username='ops', is_superuser=True, is_active=True)",
        f"with schema_context({schema!r}):", *(f"    {line}" for line in code.splitlines()),
    ])
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "TALLY_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "REDIS_URL": django_settings.REDIS_URL, "TALLY_LOG_LEVEL": "WARNING",
    }
    env.pop("PYTEST_XDIST_WORKER", None)  # REDIS_URL is this worker's already (config/settings/test.py)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_redis(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of this test's own, which the throttles and the key epoch use."""
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 5
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    monkeypatch.setattr(throttling, "_redis_down_until", 0.0)
    monkeypatch.setattr(epochs, "_read_down_until", 0.0)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


@dataclass
class LiveKey:
    customer: Customer
    key_id: str
    raw: str


@pytest.fixture
def live_key(live_tenant: Tenant, settings: Any, private_redis: subprocess.Popen[bytes]) -> LiveKey:
    """A committed customer with a key (other processes see it), the cache on for 60 s, and
    a Redis of this test's own: the suite's other workers share tenant A's schema name,
    and their epoch bumps must not make this test's hits re-read."""
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    customer = customer_create(name=f"Epoch {uuid.uuid4().hex[:8]}")
    row, raw = api_key_create(principal=customer)
    return LiveKey(customer=customer, key_id=row.pk, raw=raw)


def _client() -> Client:
    return Client(HTTP_HOST=TENANT_A["domain"])


def _get(key: str) -> Any:
    return _client().get(WALLET, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_hit_runs_no_key_statement(live_key: LiveKey) -> None:
    with _auth_statements() as first:
        assert _get(live_key.raw).status_code == 200
    with _auth_statements() as second:
        assert _get(live_key.raw).status_code == 200
    assert len(first) == 1 and second == []  # the key (and its principal) came from the cache


def test_a_revoke_in_another_process_ends_the_key_on_the_next_request(live_key: LiveKey) -> None:
    assert _get(live_key.raw).status_code == 200
    with _auth_statements() as cached:
        assert _get(live_key.raw).status_code == 200
    assert cached == []  # served from this process's cache: what the revoke must reach
    _in_another_process(f"api_key_revoke(api_key=ApiKey.objects.get(pk={live_key.key_id!r}))")

    denied = _get(live_key.raw)
    assert denied.status_code == 401 and error_of(denied)["code"] == "api_key_invalid"
    # A revoked key reaches neither the idempotency layer nor a view...
    idem = uuid.uuid4().hex
    refused = _client().post(TOKENS, data="{}", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {live_key.raw}",
                             HTTP_IDEMPOTENCY_KEY=idem)
    assert refused.status_code == 401
    assert not IdempotencyRecord.objects.filter(key=idem).exists()
    assert not PaymentToken.objects.filter(customer=live_key.customer).exists()


def test_a_key_revoked_elsewhere_is_told_401_on_another_face_too(live_key: LiveKey) -> None:
    """The face gate runs before the throttles read the epoch: a cached key it would refuse
    is checked against PostgreSQL first, so a dead key is 401 there, never "wrong face"."""
    assert _get(live_key.raw).status_code == 200
    _in_another_process(f"api_key_revoke(api_key=ApiKey.objects.get(pk={live_key.key_id!r}))")
    denied = _client().get("/v1/terminal/payments", HTTP_AUTHORIZATION=f"Bearer {live_key.raw}")
    assert denied.status_code == 401 and error_of(denied)["code"] == "api_key_invalid"


def test_a_revoke_that_commits_during_the_cache_fill_is_not_trusted(live_key: LiveKey) -> None:
    """The epoch an entry keeps is read before its database read: a revoke committed (and
    its epoch bumped) between that read and the caching must not leave a trusted entry."""
    revoked: list[bool] = []

    def revoke_after_the_key_read(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if KEY_LOOKUP in sql and not revoked:
            revoked.append(True)
            _in_another_process(f"api_key_revoke(api_key=ApiKey.objects.get(pk={live_key.key_id!r}))")
        return result

    with connection.execute_wrapper(revoke_after_the_key_read):
        assert _get(live_key.raw).status_code == 200  # it read the key while it was live
    assert revoked
    assert _get(live_key.raw).status_code == 401


def test_a_rotation_in_another_process_ends_the_old_key_when_its_overlap_ends(live_key: LiveKey, key_clock: KeyClock) -> None:
    assert _get(live_key.raw).status_code == 200  # cached with no expiry
    # This process's clock stops before the rotation: its 2 s overlap cannot run out here
    # while the other process exits and the request below is served, however slow the machine.
    key_clock.hold(timezone.now())
    _in_another_process(f"print(api_key_rotate(api_key=ApiKey.objects.get(pk={live_key.key_id!r}), issuer=superuser, overlap=timedelta(seconds=2)))")
    expires_at = ApiKey.objects.get(pk=live_key.key_id).expires_at
    assert expires_at is not None
    with _auth_statements() as reread:
        assert _get(live_key.raw).status_code == 200  # still inside the overlap
    assert len(reread) == 1  # the epoch moved: read again, now with its expiry
    key_clock.hold(expires_at + timedelta(milliseconds=100))
    assert _get(live_key.raw).status_code == 401  # within the cache's 60 s: the expiry ended it


def test_epochs_are_per_tenant(live_key: LiveKey) -> None:
    assert _get(live_key.raw).status_code == 200
    api_key_epoch_bump(schema=TENANT_B["schema_name"])
    with _auth_statements() as other_tenant_bumped:
        assert _get(live_key.raw).status_code == 200
    assert other_tenant_bumped == []  # tenant B's change does not touch tenant A's entries
    api_key_epoch_bump(schema=TENANT_A["schema_name"])
    with _auth_statements() as own_tenant_bumped:
        assert _get(live_key.raw).status_code == 200
    assert len(own_tenant_bumped) == 1


def test_redis_down_means_postgres_on_every_request(live_key: LiveKey, private_redis: subprocess.Popen[bytes]) -> None:
    assert _get(live_key.raw).status_code == 200
    with _auth_statements() as cached:
        assert _get(live_key.raw).status_code == 200
    assert cached == []
    private_redis.kill()
    private_redis.wait(5)
    for _ in range(3):
        with _auth_statements() as each:
            assert _get(live_key.raw).status_code == 200
        assert len(each) == 1  # the cache is not trusted: PostgreSQL answers every request
    ApiKey.objects.filter(pk=live_key.key_id).update(revoked_at=timezone.now())  # no bump can reach anyone now
    assert _get(live_key.raw).status_code == 401


def test_a_failed_epoch_bump_is_logged_and_counted(
    live_key: LiveKey, private_redis: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    private_redis.kill()
    private_redis.wait(5)
    failures = API_KEY_EPOCH_BUMP_FAILURES.labels(tenant=TENANT_A["schema_name"])._value.get()
    with caplog.at_level(logging.ERROR, logger="tally.wallets"):
        api_key_revoke(api_key=ApiKey.objects.get(pk=live_key.key_id))  # commits: the bump runs after commit
    assert API_KEY_EPOCH_BUMP_FAILURES.labels(tenant=TENANT_A["schema_name"])._value.get() == failures + 1
    assert any("api key epoch bump failed" in r.getMessage() for r in caplog.records)
    assert ApiKey.objects.get(pk=live_key.key_id).revoked_at is not None  # the revoke itself stands
