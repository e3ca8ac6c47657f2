"""The outbox relay's kick after commit (docs/ARCHITECTURE.md, "After the commit"),
coalesced in Redis (fastpath.kicks): at most one pending kicked relay per schema, relays of
a schema at most every RELAY_MIN_INTERVAL_MS. The relay lives above payments: the task is
sent by name, the schema in tenant-schemas-celery's `_schema_name` header. The kick is only
for latency and never raises: beat relays the due work a lost kick missed."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from fastpath.kicks import kick_claim, kick_drop, kick_started, on_commit_queued
from tenants.duework import due_work_mark
from tenants.models import DueWorkKind

logger = logging.getLogger(__name__)

RELAY_TASK_NAME = "webhooks.outbox_relay"
KICK_PENDING_SECONDS = 2
# A run's fixed work (the task, publishing, the first and last claims) is shared by what
# 250 ms of commits brought (docs/WEBHOOKS.md, "Celery configured for money").
RELAY_MIN_INTERVAL_MS = 250


def _kick_pending_key(schema_name: str) -> str:
    return f"tally:outbox:kick_pending:{schema_name}"


def _relay_started_key(schema_name: str) -> str:
    return f"tally:outbox:relay_started_ms:{schema_name}"


@dataclass(frozen=True)
class _RelayKick:
    schema_name: str

    def __call__(self) -> None:
        if not getattr(settings, "TALLY_OUTBOX_RELAY_KICK", True):
            return  # kicks off: the beat sweep alone relays
        headers = {"_schema_name": self.schema_name}
        kick_token = ""
        try:
            if current_app.conf.task_always_eager:
                # send_task ignores eager mode: run the registered task in this process
                # (tests, and `CELERY_TASK_ALWAYS_EAGER=true` set-ups), as the worker would.
                task = current_app.tasks.get(RELAY_TASK_NAME)
                if task is not None:
                    task.apply(headers=headers)
                return
            kick_token = secrets.token_hex(8)
            wait_ms = _kick_pending_claim(self.schema_name, kick_token=kick_token)
            if wait_ms is None:
                return  # a kicked relay has not started yet: it will read this commit's event
            # No publish retries: a broker that is down must not hold the request; the
            # beat sweep catches up.
            current_app.send_task(
                RELAY_TASK_NAME, kwargs={"kick_token": kick_token}, headers=headers, retry=False, ignore_result=True,
                countdown=wait_ms / 1000 if wait_ms else None,
            )
        except Exception:  # the money committed; the sweep relays what this kick missed
            _kick_pending_drop(self.schema_name, kick_token=kick_token)
            logger.warning("outbox relay kick failed; the beat sweep will relay", exc_info=True)


def _kick_pending_claim(schema_name: str, *, kick_token: str) -> int | None:
    """None when a kick is pending already; else how many ms the kicked relay must wait."""
    return kick_claim(
        pending_key=_kick_pending_key(schema_name), started_key=_relay_started_key(schema_name), token=kick_token,
        pending_ms=KICK_PENDING_SECONDS * 1000, interval_ms=RELAY_MIN_INTERVAL_MS,
    )


def _kick_pending_drop(schema_name: str, *, kick_token: str) -> None:
    """A kick's publish failed: the next commit kicks again."""
    if kick_token:  # else it failed before it claimed the mark
        kick_drop(pending_key=_kick_pending_key(schema_name), token=kick_token)


def outbox_relay_kick_pending_clear(*, schema_name: str, kick_token: str = "") -> None:
    """A relay of `schema_name` starts (before reading the outbox): record its start, and if
    the pending mark's kick sent it (`kick_token`), clear the mark so the next commit kicks
    again; a relay no kick sent leaves it (the kicked relay is still due)."""
    kick_started(pending_key=_kick_pending_key(schema_name), started_key=_relay_started_key(schema_name), token=kick_token)


def outbox_relay_kick_on_commit() -> None:
    """Kick the relay once after the current transaction commits (at once outside one), and
    mark the tenant's relay work due in it. Locks: the tenant's relay due-work lock, SHARED."""
    kick = _RelayKick(str(getattr(connection, "schema_name", "public")))
    if on_commit_queued(kick):
        return
    due_work_mark(kind=DueWorkKind.RELAY, due_at=timezone.now())
    transaction.on_commit(kick, robust=True)
