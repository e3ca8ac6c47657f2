"""Back-office staff actions: at most once per confirmation page (each carries its own
idempotency key, run through `idempotency_run` under the staff member's login), audited in
the same transaction: a double-clicked button or resubmitted form acts once."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import models

from idempotency.entry import idempotency_run
from idempotency.sealing import STAFF_PRINCIPAL_PREFIX, STAFF_SCOPE_PREFIX, response_body_seal, response_body_unseal
from wallets.services.audit import audit_record

# Never copied into the audit log's before/after snapshots.
SECRET_FIELDS = frozenset({
    "key_hash", "token_hash", "secret", "previous_secret", "secret_plaintext", "previous_secret_plaintext", "response_body", "response_headers",
})


@dataclass(frozen=True)
class StaffActionResult:
    message: str
    replayed: bool
    secret: str | None = None  # a secret shown once (a rotated API key), never stored in clear


def _snapshot(obj: models.Model) -> dict[str, Any]:
    """Its fields for the audit log (which stores them as JSON), secrets left out."""
    return {
        f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.name not in SECRET_FIELDS and not isinstance(f, models.BinaryField)
    }


def staff_action_run(
    *,
    user_id: int | None,
    action: str,
    target: models.Model,
    idempotency_key: str,
    data: dict[str, Any],
    fn: Callable[[], str | tuple[str, str]],
    audit: bool = True,
) -> StaffActionResult:
    """Run `fn` (one service call returning a message, or a message and a secret) at most
    once for (this staff login, `idempotency_key`), in one transaction with the audit entry
    `admin.<action>`; `audit=False` when the service writes its own. Locks: the
    idempotency claim, then whatever `fn` takes. Raises what `fn` raises."""
    label = target._meta.label_lower
    principal_id = f"{STAFF_PRINCIPAL_PREFIX}{user_id}"

    def run(_ctx: object) -> dict[str, str]:
        before = _snapshot(type(target)._default_manager.get(pk=target.pk))
        outcome = fn()
        message, secret = outcome if isinstance(outcome, tuple) else (outcome, None)
        stored = {"message": message}
        if secret is not None:  # sealed like the API's secret-bearing responses
            sealed = response_body_seal(body=secret.encode(), principal_id=principal_id, key=idempotency_key)
            stored["secret_sealed"] = base64.b64encode(sealed).decode("ascii")
        if audit:
            after = _snapshot(type(target)._default_manager.get(pk=target.pk))
            audit_record(
                action=f"admin.{action}", target_type=label, target_id=str(target.pk), before=before,
                after={**after, "form": data, "result": message}, reason=str(data.get("reason", "")),
            )
        return stored

    result = idempotency_run(
        scope=f"{STAFF_SCOPE_PREFIX}{label}:{action}", principal_id=principal_id, key=idempotency_key,
        payload={"target": str(target.pk), "data": data}, fn=run,
    )
    secret = None
    if sealed := result.value.get("secret_sealed"):
        secret = response_body_unseal(stored=base64.b64decode(sealed), principal_id=principal_id, key=idempotency_key).decode()
    return StaffActionResult(message=str(result.value["message"]), replayed=result.replayed, secret=secret)
