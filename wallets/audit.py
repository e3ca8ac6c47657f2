"""Where an audited change comes from: who, from which address, in which request.

config.middleware sets the origin of every request; commands and tasks are "system". The
actor is resolved when an entry is written, so an API request's principal (known only
inside the view) is the actor of what that request changes.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AuditOrigin:
    via: str = "system"  # admin | api | system
    ip: str | None = None
    request_id: str = ""
    # Returns the request's user: a Django user (admin) or an API principal.
    user: Callable[[], object] = field(default=lambda: None)


_SYSTEM = AuditOrigin()
_origin: contextvars.ContextVar[AuditOrigin | None] = contextvars.ContextVar("tally_audit_origin", default=None)


def audit_origin() -> AuditOrigin:
    return _origin.get() or _SYSTEM


@contextmanager
def audit_origin_set(origin: AuditOrigin | None) -> Iterator[None]:
    token = _origin.set(origin)
    try:
        yield
    finally:
        _origin.reset(token)


def actor_label(user: object) -> str:
    """`user:<username>` for a staff login, `<type>:<id> key <prefix>` for an API principal."""
    if user is None:
        return "system"
    principal_type, principal_id = getattr(user, "type", None), getattr(user, "id", None)
    api_key = getattr(user, "api_key", None)
    if isinstance(principal_type, str) and principal_id is not None and api_key is not None:
        return f"{principal_type}:{principal_id} key {getattr(api_key, 'prefix', '?')}"
    if getattr(user, "is_authenticated", False):
        return f"user:{user.get_username()}"  # type: ignore[attr-defined]
    return "anonymous"
