"""The audit log's one writer (wallets.models.AuditEntry)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from wallets.audit import actor_label, audit_origin
from wallets.models import AuditEntry


def _jsonable(value: Mapping[str, Any] | None) -> Any:
    return None if value is None else json.loads(json.dumps(dict(value), cls=DjangoJSONEncoder))


def audit_record(
    *,
    action: str,
    target_type: str,
    target_id: str,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    reason: str = "",
    actor: str | None = None,
) -> AuditEntry:
    """Append one entry in the caller's transaction; who and from where come from
    wallets.audit, `actor` overrides who. Locks: none (an INSERT)."""
    origin = audit_origin()
    return AuditEntry.objects.create(
        actor=(actor or actor_label(origin.user()))[:200],
        action=action[:64],
        target_type=target_type[:64],
        target_id=str(target_id)[:64],
        before=_jsonable(before),
        after=_jsonable(after),
        reason=str(reason)[:500],
        via=origin.via,
        ip=origin.ip,
        request_id=origin.request_id[:64],
    )
