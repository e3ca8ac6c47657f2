"""The per-process cache of live API keys (wallets.selectors, TALLY_API_KEY_CACHE_SECONDS).

A key revoked or rotated through the services stops working at once in the process that
did it; a change this process did not make (another gunicorn worker or host: simulated
here by writing the row with QuerySet.update, which is what this process sees of another
one's write) stops it within the cache's TTL. Keys are cached per tenant schema: a cached
key of tenant A never opens tenant B.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.utils import timezone

from tests.api.conftest import Api, World, error_of
from wallets.models import ApiKey
from wallets.services.principals import api_key_revoke, api_key_rotate

WALLET = "/v1/customer/wallet"


def _key_row(world: World) -> ApiKey:
    return ApiKey.objects.get(customer=world.customer.obj)


def test_a_change_made_elsewhere_is_seen_within_the_ttl(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 0.5
    assert api.get(WALLET, world.customer.key).status_code == 200  # now cached
    started = time.monotonic()
    ApiKey.objects.filter(pk=_key_row(world).pk).update(revoked_at=timezone.now())  # as another process would
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
    _, new_raw = api_key_rotate(api_key=_key_row(world), overlap=timedelta(0))
    assert api.get(WALLET, world.customer.key).status_code == 401
    assert api.get(WALLET, new_raw).status_code == 200


def test_a_cached_key_stops_when_its_overlap_ends(api: Api, world: World, settings: Any) -> None:
    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    old = _key_row(world)
    api_key_rotate(api_key=old, overlap=timedelta(seconds=3))
    assert api.get(WALLET, world.customer.key).status_code == 200  # cached with its expires_at
    expires_at = old.expires_at
    assert expires_at is not None
    time.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.1)
    assert api.get(WALLET, world.customer.key).status_code == 401


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
    from wallets.selectors import api_key_get_active_cached

    settings.TALLY_API_KEY_CACHE_SECONDS = 60
    first = api_key_get_active_cached(raw_key=world.customer.key)
    assert first is not None and first.customer is not None
    first.customer.name = "changed in one request only"
    second = api_key_get_active_cached(raw_key=world.customer.key)
    assert second is not None and second.customer is not None
    assert second is not first and second.customer.name == world.customer.obj.name
