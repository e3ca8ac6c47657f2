"""The phases of a staged migration and the switches the service layer reads.
`staged_phase(name)` is cached per process and tenant for TALLY_STAGED_PHASE_TTL_SECONDS
(a dict lookup on the hot path, not a query). The runner makes that safe: after a phase
change that changes what writers do, it waits `staged_fence_seconds()` before relying on
every writer having seen it.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection

from wallets.models import StagedMigrationState, StagedPhase

PHASE_ORDER: tuple[StagedPhase, ...] = tuple(StagedPhase)  # declared in order

_cache: dict[tuple[str, str], tuple[float, StagedPhase]] = {}


def phase_index(phase: StagedPhase | str) -> int:
    return PHASE_ORDER.index(StagedPhase(phase))


def phase_ttl_seconds() -> float:
    return float(getattr(settings, "TALLY_STAGED_PHASE_TTL_SECONDS", 1.0))


def staged_fence_seconds() -> float:
    """How long after a phase change every process has seen it and every transaction that
    read the old phase has ended."""
    return phase_ttl_seconds() + float(getattr(settings, "TALLY_STAGED_FENCE_GRACE_SECONDS", 1.0))


def staged_phase(name: str) -> StagedPhase:
    """The phase of migration `name` in the current tenant (cached)."""
    key = (str(getattr(connection, "schema_name", "public")), name)
    now = time.monotonic()
    hit = _cache.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    value = StagedMigrationState.objects.filter(name=name).values_list("phase", flat=True).first()
    phase = StagedPhase(value) if value else StagedPhase.ABSENT
    _cache[key] = (now + phase_ttl_seconds(), phase)
    return phase


def staged_phase_forget() -> None:
    """Drop the cache (tests, and the runner's own process after it changes a phase)."""
    _cache.clear()


def writes_new(phase: StagedPhase) -> bool:
    """Dual writes: the new representation is written from expand on."""
    return phase != StagedPhase.ABSENT


def writes_old(phase: StagedPhase) -> bool:
    """The old representation is written until contract starts."""
    return phase_index(phase) < phase_index(StagedPhase.CONTRACTING)


def reads_new(phase: StagedPhase) -> bool:
    return phase_index(phase) >= phase_index(StagedPhase.READS_SWITCHED)
