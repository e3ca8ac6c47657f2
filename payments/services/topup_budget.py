"""Time budgets of a recovery pass, and where each of its loops resumes (docs/RELIABILITY.md,
"A slow PSP"). Each loop (the payout pass, then card refunds, orphaned claims, pending
top-ups) takes records only while its own budget lasts (TALLY_TOPUP_RECOVERY_LOOP_SECONDS)
and never past the pass's one deadline (TALLY_TOPUP_RECOVERY_PASS_SECONDS), which the
recovery task takes once for both sagas; the record in hand is finished. A loop cut short remembers where it stopped in the cache, per tenant, and the
next pass resumes after it and comes round to the start, so records failing at the head
cannot hold back the rest; lost (Redis down, evicted), the loop starts from the oldest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

import redis
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError
from django.db.models import QuerySet

from payments.models import TopUp
from payments.selectors import TopUpCursor, topups_page
from payments.services.topups import topup_last_error_note
from wallets.transactions import is_connection_failure

logger = logging.getLogger("tally.topups")

_CURSOR_KEY = "topups:recovery:resume:{loop}"
_CURSOR_TTL_SECONDS = 24 * 3600


def recovery_pass_deadline() -> float:
    """The `time.monotonic()` instant a pass starting now stops taking records by."""
    return time.monotonic() + float(settings.TALLY_TOPUP_RECOVERY_PASS_SECONDS)


@dataclass
class LoopBudget:
    """One loop's share of a pass: `spent()` once `seconds` have gone since it started."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    exhausted: bool = False

    @classmethod
    def from_settings(cls, *, pass_deadline: float) -> LoopBudget:
        """The loop's own budget, cut to the time left before `pass_deadline` (monotonic)."""
        return cls(seconds=max(0.0, min(float(settings.TALLY_TOPUP_RECOVERY_LOOP_SECONDS), pass_deadline - time.monotonic())))

    def spent(self) -> bool:
        if not self.exhausted and time.monotonic() - self.started >= self.seconds:
            self.exhausted = True
        return self.exhausted


def _resume_get(loop: str) -> TopUpCursor | None:
    try:
        raw = cache.get(_CURSOR_KEY.format(loop=loop))
    except (redis.RedisError, OSError):  # the cache is a hint: without it, start from the oldest
        logger.warning("top-up recovery resume point unreadable: starting from the oldest", extra={"loop": loop})
        return None
    if not (isinstance(raw, (list, tuple)) and len(raw) == 2):
        return None
    try:
        return TopUpCursor(created=datetime.fromisoformat(str(raw[0])), id=str(raw[1]))
    except ValueError:
        return None


def _resume_set(loop: str, cursor: TopUpCursor | None) -> None:
    key = _CURSOR_KEY.format(loop=loop)
    try:
        if cursor is None:
            cache.delete(key)
        else:
            cache.set(key, [cursor.created.isoformat(), cursor.id], _CURSOR_TTL_SECONDS)
    except (redis.RedisError, OSError):
        logger.warning("top-up recovery resume point not saved", extra={"loop": loop})


def topups_in_turn(*, loop: str, topups: QuerySet[TopUp], batch_size: int, budget: LoopBudget) -> Iterator[TopUp]:
    """Every one of `topups`, each at most once, by keyset pages: from after where this loop
    last stopped to the end, then from the oldest up to there. Once `budget` is spent,
    remembers the last one handed out as where the next pass resumes; a loop that got round
    leaves no resume point."""
    start = _resume_get(loop)
    last: TopUpCursor | None = None
    for wrapped in ((False, True) if start is not None else (False,)):
        after = None if wrapped else start
        before = start if wrapped else None
        while True:
            page = topups_page(topups, after=after, before=before, limit=batch_size)
            for topup in page:
                if budget.spent():
                    _resume_set(loop, last if last is not None else start)
                    return
                last = TopUpCursor.of(topup)
                yield topup
            if len(page) < batch_size:
                break
            after = TopUpCursor.of(page[-1])
    _resume_set(loop, None)


def recovery_step_isolated(*, step: str, topup_id: str, fn: Callable[[], str]) -> str:
    """`fn()`'s outcome, or "error" if it raises (logged, kept as the top-up's last error).
    A lost database connection is no one record's fault, and Celery's soft time limit ends
    the pass: both propagate (SoftTimeLimitExceeded is an Exception: named first)."""
    try:
        return fn()
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:
        if isinstance(exc, DatabaseError) and is_connection_failure(exc):
            raise
        logger.exception("top-up recovery failed on one record; the run goes on", extra={"topup": topup_id, "step": step})
        try:
            topup_last_error_note(topup_id=topup_id, error=f"{step}: {type(exc).__name__}: {exc}")
        except DatabaseError:
            logger.warning("could not note the error on the top-up", extra={"topup": topup_id})
        return "error"
