"""Relay kicks are coalesced (payments.services.outbox): while a kicked relay has not
started, later commits send no kick, and that relay still reads their events, because it
clears the mark before it reads the outbox; no other relay clears it. Real Redis; the
Celery publish is counted."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from celery import current_app
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import payments.relaykick as outbox
from fastpath.fastredis import fast_redis
from payments.models import OutboxEvent
from payments.services.charges import payment_create
from tenants.models import Tenant
from tests.factories import CustomerFactory, TerminalFactory, fund
from webhooks.services.relay import outbox_relay_run


@pytest.fixture
def sends(tenant: Tenant, monkeypatch: Any) -> Iterator[list[dict[str, Any]]]:
    """Kicks as a worker would see them: not eager, each publish recorded."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append({"name": name, **kw}))
    schema = str(connection.schema_name)
    mark_reset(schema)
    with not_eager():
        yield sent
    mark_reset(schema)


def mark_reset(schema: str) -> None:
    fast_redis().delete(outbox._kick_pending_key(schema))


@contextlib.contextmanager
def not_eager() -> Iterator[None]:
    saved = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = False
    try:
        yield
    finally:
        current_app.conf.task_always_eager = saved


def test_kicks_while_one_is_pending_send_nothing(sends: list[dict[str, Any]]) -> None:
    schema = str(connection.schema_name)
    for _ in range(5):
        outbox._RelayKick(schema)()
    assert len(sends) == 1 and sends[0]["headers"] == {"_schema_name": schema}
    outbox.outbox_relay_kick_pending_clear(schema_name=schema, kick_token=sends[0]["kwargs"]["kick_token"])  # the relay started
    outbox._RelayKick(schema)()
    assert len(sends) == 2


def test_a_relay_no_kick_sent_leaves_the_mark_to_the_kicked_one(sends: list[dict[str, Any]]) -> None:
    """The beat sweep's relay (or one run by hand) starting while a kicked relay waits out
    its countdown: the commits after it send nothing, since the kicked relay, still to run,
    reads their events. Before, the sweep cleared the mark and the next commit kicked a
    second relay, and the two then alternated for good."""
    schema = str(connection.schema_name)
    outbox._RelayKick(schema)()
    outbox_relay_run()  # the sweep's relay
    outbox._RelayKick(schema)()
    assert len(sends) == 1
    outbox_relay_run(kick_token="0" * 16)  # a relay of a kick whose mark lapsed
    outbox._RelayKick(schema)()
    assert len(sends) == 1
    outbox_relay_run(kick_token=sends[0]["kwargs"]["kick_token"])  # the kicked relay
    outbox._RelayKick(schema)()
    assert len(sends) == 2 and sends[1]["kwargs"]["kick_token"] != sends[0]["kwargs"]["kick_token"]


def test_a_failed_publish_leaves_no_mark(tenant: Tenant, monkeypatch: Any) -> None:
    schema = str(connection.schema_name)
    outbox.outbox_relay_kick_pending_clear(schema_name=schema)
    fast_redis().delete(outbox._relay_started_key(schema))
    attempts: list[str] = []

    def broken(name: str, **_: Any) -> None:
        attempts.append(name)
        raise ConnectionError("broker down")

    monkeypatch.setattr(current_app, "send_task", broken)
    with not_eager():
        outbox._RelayKick(schema)()
        outbox._RelayKick(schema)()
    assert len(attempts) == 2  # each commit tries again: no mark was left behind
    assert fast_redis().get(outbox._relay_started_key(schema)) is None  # and no relay counts as started
    mark_reset(schema)


def test_a_failed_publish_drops_only_its_own_mark(sends: list[dict[str, Any]]) -> None:
    """A publish that failed after its mark lapsed and another kick claimed a new one: the
    other kick's mark stays, since its relay is still to run."""
    schema = str(connection.schema_name)
    outbox._RelayKick(schema)()
    token = sends[0]["kwargs"]["kick_token"]
    outbox._kick_pending_drop(schema, kick_token="0" * 16)  # a failed publish of an earlier kick
    assert fast_redis().get(outbox._kick_pending_key(schema)) == token.encode()
    outbox._kick_pending_drop(schema, kick_token=token)
    assert fast_redis().get(outbox._kick_pending_key(schema)) is None


def test_the_kicked_relay_clears_the_mark_before_it_reads_the_outbox(sends: list[dict[str, Any]], monkeypatch: Any) -> None:
    """A commit landing after the relay's read would find no mark and kick again; one
    landing before it is read. Cleared after the read, a commit in between would be coalesced
    into a relay that had already read past it."""
    import webhooks.services.relay as relay

    schema = str(connection.schema_name)
    outbox._RelayKick(schema)()
    marks_at_read: list[bytes | None] = []
    publish = relay.outbox_batch_publish

    def reading(**kwargs: Any) -> tuple[int, int]:
        marks_at_read.append(fast_redis().get(outbox._kick_pending_key(schema)))
        return publish(**kwargs)

    monkeypatch.setattr(relay, "outbox_batch_publish", reading)
    outbox_relay_run(kick_token=sends[0]["kwargs"]["kick_token"])
    assert marks_at_read == [None]


def test_an_event_whose_kick_was_coalesced_is_read_by_the_pending_relay(sends: list[dict[str, Any]]) -> None:
    customer, terminal = CustomerFactory(), TerminalFactory()
    fund(customer, 100)
    schema = str(connection.schema_name)
    outbox._RelayKick(schema)()  # an earlier commit's kick: its relay has not started
    assert len(sends) == 1
    payment = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=7)
    for callback in [entry[1] for entry in connection.run_on_commit]:  # the commit's hooks (rolled-back test transaction)
        callback()
    assert len(sends) == 1  # coalesced: no publish
    outbox_relay_run(kick_token=sends[0]["kwargs"]["kick_token"])  # the pending relay starts: clears the mark, then reads
    event = OutboxEvent.objects.get(topic="payment.succeeded", payload__id=payment.id)
    assert event.published_at is not None
    assert fast_redis().get(outbox._kick_pending_key(schema)) is None


def test_a_kick_soon_after_a_relay_started_waits_for_the_rest_of_the_interval(sends: list[dict[str, Any]]) -> None:
    schema = str(connection.schema_name)
    outbox.outbox_relay_kick_pending_clear(schema_name=schema)  # a relay starts now (the sweep's)
    outbox._RelayKick(schema)()
    countdown = sends[0]["countdown"]
    assert 0 < countdown <= outbox.RELAY_MIN_INTERVAL_MS / 1000
    outbox._RelayKick(schema)()  # the mark holds through the countdown: nothing more is sent
    assert len(sends) == 1


def test_a_kick_after_the_interval_relays_at_once(sends: list[dict[str, Any]]) -> None:
    schema = str(connection.schema_name)
    a_minute_ago_ms = 1_000 * (int(fast_redis().time()[0]) - 60)
    fast_redis().set(outbox._relay_started_key(schema), a_minute_ago_ms)
    outbox._RelayKick(schema)()
    assert sends[0]["countdown"] is None


def test_with_redis_down_a_kick_relays_at_once(tenant: Tenant, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # refused: fast_redis() fails at once
    assert outbox._kick_pending_claim(str(connection.schema_name), kick_token="t") == 0


_SCHEMA_OF_THE_MODEL = "kick_model"  # a schema name of its own: only Redis keys, no tables
_STEPS = st.sampled_from(["commit", "kicked relay starts", "sweep relay starts", "mark lapses"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(_STEPS, st.integers(0, 3)), max_size=40))
def test_at_most_one_kicked_relay_waits_and_every_coalesced_commit_has_one(steps: list[tuple[str, int]], monkeypatch: Any) -> None:
    """Any interleaving of commits, kicked relays starting (in any order: countdowns can
    finish out of order), sweep relays and marks lapsing: a commit that sends nothing finds
    the mark of a kicked relay that has not started (so that relay reads its event), and no
    more kicked relays wait than one plus the marks that lapsed."""
    schema = _SCHEMA_OF_THE_MODEL
    sent: list[str] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append(kw["kwargs"]["kick_token"]))
    mark_reset(schema)
    waiting: list[str] = []  # kicked relays published and not started
    lapses = 0
    with not_eager():
        for step, pick in steps:
            if step == "commit":
                before = len(sent)
                outbox._RelayKick(schema)()
                if len(sent) > before:
                    waiting.append(sent[-1])
                else:
                    mark = fast_redis().get(outbox._kick_pending_key(schema))
                    assert mark is not None and mark.decode() in waiting, "a coalesced commit whose relay already ran"
            elif step == "kicked relay starts" and waiting:
                outbox.outbox_relay_kick_pending_clear(schema_name=schema, kick_token=waiting.pop(pick % len(waiting)))
            elif step == "sweep relay starts":
                outbox.outbox_relay_kick_pending_clear(schema_name=schema)
            elif step == "mark lapses":
                lapses += fast_redis().delete(outbox._kick_pending_key(schema))
            assert len(waiting) <= 1 + lapses
    mark_reset(schema)


def test_a_resent_claim_keeps_its_own_mark(sends: list[dict[str, Any]]) -> None:
    """redis-py resends a script whose answer timed out: the second run finds the mark the
    first one set, which is this kick's own, and must still say "send the relay"."""
    schema = str(connection.schema_name)
    assert outbox._kick_pending_claim(schema, kick_token="a" * 16) is not None
    assert outbox._kick_pending_claim(schema, kick_token="a" * 16) is not None  # the resend
    assert outbox._kick_pending_claim(schema, kick_token="b" * 16) is None  # another kick coalesces
