"""Merchant webhook signing secrets, sealed at rest (not hashed: they sign every delivery),
bound to the tenant schema, the endpoint and the field, so a sealed secret copied elsewhere
does not open; and the staged migration `webhook_secrets` from the plaintext columns
(`secret` / `previous_secret`) to `secret_sealed` / `previous_secret_sealed` (NULL until
sealed; a NULL previous beside a sealed current: none). By the tenant's phase:
  absent                  write old; read old
  expanded .. verified    write both (same statement); read old
  reads_switched          write both; read new (old for a row not sealed yet)
  contracting/contracted  write new; read new; contract seals any row left and empties
                          the plaintext columns (they stay, empty)
A new tenant starts at `contracted` (`webhook_secrets_new_tenant`). Every read goes
through `webhook_endpoint_secrets`, every write through `webhook_endpoint_secrets_assign`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from django.db import connection, transaction
from django.db.models import Q

from wallets.sealing import UNOPENED, ResealBatch, SealScheme, secret_needs_reseal, secret_reseal, secret_seal, secret_unseal
from wallets.staged.phases import reads_new, staged_phase, writes_new, writes_old
from wallets.staged.runner import staged_start_contracted
from wallets.staged.spec import BatchResult, StagedMigration, StagedMigrationRefused, VerifyReport
from wallets.transactions import run_atomic
from webhooks.locks import webhook_endpoint_rows_lock
from webhooks.models import WebhookEndpoint

MIGRATION: Final = "webhook_secrets"
SCHEME: Final = SealScheme(purpose=b"tally/webhooks/signing-secret/v1", tag=b"tally-whsec")
CURRENT, PREVIOUS = "secret", "previous_secret"
SECRET_FIELDS: Final = ("secret_plaintext", "previous_secret_plaintext", "secret_sealed", "previous_secret_sealed")


class WebhookSecretUnavailable(RuntimeError):
    """An endpoint has no secret where its tenant's phase reads (a server fault)."""


@dataclass(frozen=True)
class EndpointSecrets:
    current: str
    previous: str  # "" when there is none


def _aad(endpoint_id: str, field: str) -> bytes:
    schema = str(getattr(connection, "schema_name", "public"))
    return f"{schema}\x00webhook_endpoint\x00{endpoint_id}\x00{field}".encode()


def webhook_secret_seal(*, secret: str, endpoint_id: str, field: str) -> bytes:
    return secret_seal(scheme=SCHEME, plaintext=secret.encode("utf-8"), associated_data=_aad(endpoint_id, field))


def webhook_secret_unseal(*, sealed: bytes | memoryview, endpoint_id: str, field: str) -> str:
    return secret_unseal(scheme=SCHEME, sealed=bytes(sealed), associated_data=_aad(endpoint_id, field)).decode("utf-8")


def _sealed(endpoint: WebhookEndpoint) -> EndpointSecrets:
    if endpoint.secret_sealed is None:
        raise WebhookSecretUnavailable(f"webhook endpoint {endpoint.pk} has no sealed secret")
    previous = endpoint.previous_secret_sealed
    return EndpointSecrets(
        current=webhook_secret_unseal(sealed=endpoint.secret_sealed, endpoint_id=endpoint.pk, field=CURRENT),
        previous="" if previous is None else webhook_secret_unseal(sealed=previous, endpoint_id=endpoint.pk, field=PREVIOUS),
    )


def webhook_endpoint_secrets(*, endpoint: WebhookEndpoint) -> EndpointSecrets:
    """The endpoint's current and previous secrets, from where the tenant's phase reads."""
    phase = staged_phase(MIGRATION)
    if not reads_new(phase) or (endpoint.secret_sealed is None and writes_old(phase)):
        return EndpointSecrets(current=endpoint.secret_plaintext, previous=endpoint.previous_secret_plaintext)
    return _sealed(endpoint)


def webhook_endpoint_secrets_assign(*, endpoint: WebhookEndpoint, current: str, previous: str) -> list[str]:
    """Set both secrets on `endpoint` (not saved) where the phase writes, the other
    representation emptied; returns the fields to save. The id must be final (it is sealed
    in); the caller holds the row lock, or is inserting the row."""
    phase = staged_phase(MIGRATION)
    old = writes_old(phase)
    endpoint.secret_plaintext = current if old else ""
    endpoint.previous_secret_plaintext = previous if old else ""
    sealed = _sealed_fields(endpoint_id=endpoint.pk, current=current, previous=previous) if writes_new(phase) else {}
    endpoint.secret_sealed = sealed.get("secret_sealed")
    endpoint.previous_secret_sealed = sealed.get("previous_secret_sealed")
    return list(SECRET_FIELDS)


def _sealed_fields(*, endpoint_id: str, current: str, previous: str) -> dict[str, Any]:
    return {
        "secret_sealed": webhook_secret_seal(secret=current, endpoint_id=endpoint_id, field=CURRENT),
        "previous_secret_sealed": webhook_secret_seal(secret=previous, endpoint_id=endpoint_id, field=PREVIOUS) if previous else None,
    }


def _seal_from_plaintext(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return _sealed_fields(endpoint_id=endpoint.pk, current=endpoint.secret_plaintext, previous=endpoint.previous_secret_plaintext)


class WebhookSecretsMigration(StagedMigration):
    """Plaintext signing secrets -> sealed columns; contract empties the plaintext."""

    name = MIGRATION
    description = "webhook signing secrets: plaintext columns -> AES-256-GCM sealed columns"

    def expand(self) -> None:
        with connection.cursor() as cursor:
            columns = {c.name for c in connection.introspection.get_table_description(cursor, WebhookEndpoint._meta.db_table)}
        if not {"secret_sealed", "previous_secret_sealed"} <= columns:
            raise StagedMigrationRefused("the sealed columns are missing: run `manage.py migrate_schemas` (webhooks 0004) first")

    def backfill_total(self) -> int:
        return WebhookEndpoint.objects.count()

    def backfill_batch(self, *, after: str, limit: int, dry_run: bool) -> BatchResult:
        """Seal each row not sealed yet from its plaintext (never overwriting one the new
        path wrote). Locks: the batch's rows in id order (webhook_endpoint_rows_lock), not
        with `dry_run`."""
        if dry_run:
            rows = list(WebhookEndpoint.objects.filter(pk__gt=after).order_by("pk")[:limit])
        else:
            rows = webhook_endpoint_rows_lock(after=after, limit=limit)
        if not rows:
            return BatchResult(cursor=None, rows_seen=0, rows_written=0)
        unsealed = [row for row in rows if row.secret_sealed is None]
        if not dry_run:
            for row in unsealed:
                WebhookEndpoint.objects.filter(pk=row.pk, secret_sealed__isnull=True).update(**_seal_from_plaintext(row))
        return BatchResult(cursor=rows[-1].pk if len(rows) == limit else None, rows_seen=len(rows), rows_written=len(unsealed))

    def verify(self) -> VerifyReport:
        """Every endpoint, in one REPEATABLE READ snapshot: the unsealed secrets equal the
        plaintext ones. Reports counts, a checksum of each side (keyed by this run's random
        key, so nothing derived from a secret outlives it) and the id of every difference."""
        report = VerifyReport()
        run_key = os.urandom(32)
        old_sum, new_sum = hmac.new(run_key, digestmod=hashlib.sha256), hmac.new(run_key, digestmod=hashlib.sha256)
        endpoints = sealed = 0
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            for row in WebhookEndpoint.objects.order_by("pk").only("id", *SECRET_FIELDS).iterator(chunk_size=2000):
                endpoints += 1
                old = EndpointSecrets(current=row.secret_plaintext, previous=row.previous_secret_plaintext)
                old_sum.update(f"{row.pk}\x1f{old.current}\x1f{old.previous}\n".encode())
                if row.secret_sealed is None:
                    report.differences.append(f"{row.pk}: not sealed")
                    continue
                try:
                    new = _sealed(row)
                except (InvalidTag, ValueError, UnicodeDecodeError):
                    report.differences.append(f"{row.pk}: does not unseal")
                    continue
                sealed += 1
                new_sum.update(f"{row.pk}\x1f{new.current}\x1f{new.previous}\n".encode())
                if new.current != old.current:
                    report.differences.append(f"{row.pk}: secret differs")
                if new.previous != old.previous:
                    report.differences.append(f"{row.pk}: previous secret differs")
        report.counts = {"endpoints": endpoints, "sealed": sealed}
        report.checksums = {"old": old_sum.hexdigest(), "new": new_sum.hexdigest()}
        return report

    def contract(self) -> None:
        """Empty the plaintext columns, sealing first any row not sealed yet. Idempotent.
        Locks: batches of endpoint rows (webhook_endpoint_rows_lock)."""
        has_plaintext = ~Q(secret_plaintext="") | ~Q(previous_secret_plaintext="")
        after = ""
        while True:
            with transaction.atomic():
                rows = webhook_endpoint_rows_lock(after=after, limit=500, query=has_plaintext)
                if not rows:
                    return
                for row in rows:
                    fields: dict[str, Any] = {"secret_plaintext": "", "previous_secret_plaintext": ""}
                    if row.secret_sealed is None:
                        fields.update(_seal_from_plaintext(row))
                    WebhookEndpoint.objects.filter(pk=row.pk).update(**fields)
                after = rows[-1].pk

    def discard(self) -> None:
        """Empty the sealed columns, in batches (rollback of expand)."""
        while True:
            with transaction.atomic():
                ids = list(WebhookEndpoint.objects.filter(secret_sealed__isnull=False).order_by("pk").values_list("pk", flat=True)[:1000])
                if not ids:
                    return
                WebhookEndpoint.objects.filter(pk__in=ids).update(secret_sealed=None, previous_secret_sealed=None)


def _needs_reseal(sealed: bytes | memoryview | None, pk: str, field: str) -> bool:
    return sealed is not None and secret_needs_reseal(scheme=SCHEME, sealed=bytes(sealed), associated_data=_aad(pk, field))


def webhook_secrets_reseal(after: str = "", limit: int = 500) -> ResealBatch:
    """The sealed secrets of the next `limit` endpoints after id `after` re-sealed under the
    ring's first key. Read unlocked to find the ones to re-seal; then those rows are locked
    (webhook_endpoint_rows_lock, as every secret write is) and re-read in one transaction."""
    rows = list(
        WebhookEndpoint.objects.filter(pk__gt=after, secret_sealed__isnull=False)
        .order_by("pk")
        .values_list("pk", "secret_sealed", "previous_secret_sealed")[:limit]
    )
    candidates = [pk for pk, current, previous in rows if _needs_reseal(current, pk, CURRENT) or _needs_reseal(previous, pk, PREVIOUS)]

    def batch() -> tuple[int, list[str]]:
        resealed, unopened = 0, []
        for row in webhook_endpoint_rows_lock(after="", limit=len(candidates), query=Q(pk__in=candidates)):
            fields: dict[str, bytes] = {}
            try:
                for name, field in (("secret_sealed", CURRENT), ("previous_secret_sealed", PREVIOUS)):
                    sealed = getattr(row, name)
                    if sealed is not None:
                        new = secret_reseal(scheme=SCHEME, sealed=bytes(sealed), associated_data=_aad(row.pk, field))
                        if new is not None:
                            fields[name] = new
            except UNOPENED:
                unopened.append(str(row.pk))
                continue
            if fields:
                WebhookEndpoint.objects.filter(pk=row.pk).update(**fields)
                resealed += 1
        return resealed, unopened

    resealed, unopened = run_atomic(batch, operation="webhook_secrets_reseal") if candidates else (0, [])
    return ResealBatch(cursor=rows[-1][0] if len(rows) == limit else None, resealed=resealed, unopened=tuple(unopened))


def webhook_secrets_new_tenant(**_: Any) -> None:
    """A new tenant never had plaintext secrets: it seals from its first endpoint on."""
    staged_start_contracted(migration=WebhookSecretsMigration())
