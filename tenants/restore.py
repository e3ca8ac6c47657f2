"""Restore one tenant's schema from a copy of the database taken at an instant (the cluster's
backup restored to that instant on a scratch server: docs/RELIABILITY.md, "Restore one
tenant") into the running database, every other tenant left as it is.

How the schema lands under another name: pg_restore cannot rename a schema, and the live one
may still exist. So the source's schema is dumped (`pg_dump -n`), restored into a scratch
database on the source's server, renamed there, dumped again and restored into the live
database in one transaction: the live database only ever sees a finished staging schema or
none, and the live server does no work but that last restore. Rewriting a plain-text dump's
schema name instead would also rewrite that name wherever it appears in the data.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone
from django_tenants.utils import schema_context, schema_exists, tenant_context
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tenants.duework import due_work_mark
from tenants.middleware import tenant_cache_clear
from tenants.models import DueWorkKind, Tenant
from tenants.schemas import migrations_on_disk
from tenants.signals import StagedCheck, tenant_restore_staged, tenant_restored

Progress = Callable[[str], None]

# PostgreSQL's identifier limit (NAMEDATALEN - 1): a longer staging name would be cut silently.
_NAME_MAX = 63
_STAGING_SUFFIX, _REPLACED_SUFFIX = "_restoring_", "_replaced_"

# The comment a run puts on its staging schema in the commit that switches the tenant off:
# the staging schema exists until the swap's commit (which switches the tenant on), so a
# marked staging schema left behind is a run that died with the tenant switched off by it.
_SWITCHED_OFF_MARKER = "tenant_restore: switched the tenant off"

# A lock that was not granted in time, or a deadlock PostgreSQL broke by cancelling us.
# The run lock's own key space among PostgreSQL's two-int advisory keys.
_RUN_LOCK_SPACE = 0x72657374  # "rest"

_LOCK_REFUSALS = {"55P03": "stayed busy past", "40P01": "deadlocked with the swap, cancelled after"}


class TenantRestoreRefused(Exception):
    """The restore did not happen; the message says why and what to do."""


@dataclass(frozen=True)
class TenantRestoreReport:
    schema_name: str
    dry_run: bool
    staging_schema: str
    replaced_schema: str | None  # the live schema renamed aside, if there was one
    replaced_kept: bool
    tables: int
    notes: tuple[str, ...]
    seconds: dict[str, float] = field(default_factory=dict)


def tenant_restore(
    *, schema_name: str, source: str, dry_run: bool = False, keep_replaced: bool = False,
    lock_timeout_ms: int = 10_000, progress: Progress | None = None,
) -> TenantRestoreReport:
    """Replace tenant `schema_name`'s schema by its copy in database `source` (a libpq DSN).

    Staged: the copy lands in the live database as `<schema>_restoring_<stamp>`, its
    django_migrations must hold exactly the migrations this code knows, and the receivers of
    `tenant_restore_staged` (reconciliation: the ledger against balances) must find nothing
    blocking. `dry_run` stops there and drops the staging schema. Then the swap, one
    transaction: the live schema's credential revocations since the instant are applied to
    the copy (`_credentials_carry`), the live schema (if it still exists) becomes
    `<schema>_replaced_<stamp>`, dropped after the commit unless `keep_replaced`; staging
    becomes `<schema>`.

    Locks: a session advisory lock per tenant for the whole run (a second run of the same
    tenant is refused); the tenant's public row FOR NO KEY UPDATE (a payment's commit, whose
    due-work row takes FOR KEY SHARE on it, does not wait for it) and ACCESS EXCLUSIVE on
    every table of the live schema, for the swap's instant only, waiting at most
    `lock_timeout_ms` (then refused, nothing swapped; a deadlock with the tenant's
    transactions is refused the same way). Other tenants' tables are never locked. Before the
    swap the tenant, if it is active then, is switched off (committed, with a marker on the
    staging schema), so beat sends it no work and hosts stop serving it once their cache
    expires; the swap's own commit switches it on again, and so does a failed run. A run that
    died in between leaves the marked staging schema: the next run refuses until
    `tenant_restore_cleanup` has switched the tenant on and dropped it.
    """
    say = progress or (lambda _: None)
    stamp = timezone.now().strftime("%Y%m%d%H%M%S")
    staging, replaced = f"{schema_name}{_STAGING_SUFFIX}{stamp}", f"{schema_name}{_REPLACED_SUFFIX}{stamp}"
    if len(staging) > _NAME_MAX:  # the longer of the two names
        raise TenantRestoreRefused(f"schema name {schema_name!r} is too long for a staging name ({staging!r} is over {_NAME_MAX})")
    tenant = _tenant_restorable(schema_name=schema_name)
    with _run_lock(schema_name=schema_name):
        left = [name for name in _leftover_schemas(schema_name=schema_name) if _STAGING_SUFFIX in name]
        if left:
            raise TenantRestoreRefused(
                f"a run that did not finish left {', '.join(left)}: run `manage.py tenant_restore --schema {schema_name} --cleanup` first"
            )
        return _tenant_restore_locked(tenant=tenant, source=source, dry_run=dry_run, keep_replaced=keep_replaced,
                                      lock_timeout_ms=lock_timeout_ms, staging=staging, replaced=replaced, stamp=stamp, say=say)


def _tenant_restore_locked(
    *, tenant: Tenant, source: str, dry_run: bool, keep_replaced: bool, lock_timeout_ms: int, staging: str, replaced: str,
    stamp: str, say: Progress,
) -> TenantRestoreReport:
    schema_name = str(tenant.schema_name)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tally-tenant-restore-") as workdir:
        staged_dump = _staging_dump_build(
            schema_name=schema_name, staging=staging, source=source, workdir=Path(workdir), stamp=stamp, say=say
        )
        seconds["staged in scratch"] = round(time.monotonic() - started, 3)
        say(f"restoring {staging} into the live database")
        _pg("pg_restore", "--no-owner", "--no-acl", "--single-transaction", "--exit-on-error", "-d", _live_dsn(), str(staged_dump),
            env=_live_env())
    seconds["landed"] = round(time.monotonic() - started, 3)
    swapped = False
    try:
        say(f"checking {staging}")
        notes = _staged_check(tenant=tenant, staging=staging)
        seconds["checked"] = round(time.monotonic() - started, 3)
        tables = _tables_count(schema=staging)
        if dry_run:
            return TenantRestoreReport(schema_name=schema_name, dry_run=True, staging_schema=staging, replaced_schema=None,
                                       replaced_kept=False, tables=tables, notes=notes, seconds=seconds)
        _switch_off(tenant=tenant, staging=staging, lock_timeout_ms=lock_timeout_ms)
        say(f"swapping {staging} in as {schema_name}")
        had_live, carried = _swap(tenant=tenant, staging=staging, replaced=replaced, lock_timeout_ms=lock_timeout_ms)
        notes += carried
        swapped = True
    finally:
        if not swapped:  # refused, failed or a dry run: the tenant back on if this run switched it off, then staging goes
            _staging_discard(tenant=tenant, staging=staging, lock_timeout_ms=lock_timeout_ms)
    seconds["swapped"] = round(time.monotonic() - started, 3)
    tenant_restored.send(sender=Tenant, schema_name=schema_name)
    if had_live and not keep_replaced:
        say(f"dropping {replaced}")
        _schema_drop(schema=replaced)
        seconds["replaced dropped"] = round(time.monotonic() - started, 3)
    return TenantRestoreReport(schema_name=schema_name, dry_run=False, staging_schema=staging, replaced_schema=replaced if had_live else None,
                               replaced_kept=had_live and keep_replaced, tables=tables, notes=notes, seconds=seconds)


@dataclass(frozen=True)
class TenantRestoreCleanup:
    schema_name: str
    staging_dropped: tuple[str, ...]
    switched_on: bool  # a dropped staging schema's marker said a run had switched the tenant off, and it was still off
    replaced_left: tuple[str, ...]  # `_replaced_` schemas: a kept one is the operator's; listed, never dropped here
    scratch_dropped: tuple[str, ...]  # scratch databases on the source's server (with `source`)


def tenant_restore_cleanup(*, schema_name: str, source: str | None = None, lock_timeout_ms: int = 10_000) -> TenantRestoreCleanup:
    """After a run that died (killed, its server or connection gone): switch the tenant on
    again if that run had switched it off (its staging schema's marker says so and the tenant
    is still off; one an operator switched off is left off), drop its staging schemas, and
    with `source` the scratch databases left on the source's server. Refused while a run of
    the tenant is in progress."""
    tenant = _tenant_restorable(schema_name=schema_name)
    with _run_lock(schema_name=schema_name):
        leftovers = _leftover_schemas(schema_name=schema_name)
        switched_on = False
        for staging in (name for name in leftovers if _STAGING_SUFFIX in name):
            switched_on = _staging_discard(tenant=tenant, staging=staging, lock_timeout_ms=lock_timeout_ms) or switched_on
        scratch: list[str] = []
        if source is not None:
            with psycopg.connect(source, autocommit=True) as admin:
                rows = admin.execute("SELECT datname FROM pg_database WHERE datname ~ '^tally_restore_[0-9]{14}_[0-9]+$' ORDER BY 1").fetchall()
                for (name,) in rows:
                    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name))))
                    scratch.append(str(name))
    return TenantRestoreCleanup(schema_name=schema_name, staging_dropped=tuple(n for n in leftovers if _STAGING_SUFFIX in n),
                                switched_on=switched_on, replaced_left=tuple(n for n in leftovers if _REPLACED_SUFFIX in n),
                                scratch_dropped=tuple(scratch))


def _tenant_restorable(*, schema_name: str) -> Tenant:
    # The public rows are not restored: a tenant's row and domains are the platform's, and
    # bringing them back from the instant would roll back settings changed since. A tenant
    # deleted since is created again first (create_tenant, then this command over its schema).
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    if schema_name in ("public", str(settings.TENANT_BASE_SCHEMA)):
        raise TenantRestoreRefused(f"{schema_name!r} is not a tenant's schema")
    tenant: Tenant | None = Tenant.objects.filter(schema_name=schema_name).first()
    if tenant is None:
        raise TenantRestoreRefused(
            f"no tenant with schema {schema_name!r}: its public rows (Tenant, Domain) must exist; create it again "
            "(manage.py create_tenant with the same schema and domain, after renaming aside a schema its deleted row left behind, "
            "then restore over the new schema)"
        )
    return tenant


def _staging_dump_build(*, schema_name: str, staging: str, source: str, workdir: Path, stamp: str, say: Progress) -> Path:
    """The source's schema as a custom-format dump of a schema named `staging`, made in a
    scratch database on the source's server (dropped after)."""
    source_dump, staged_dump = workdir / "source.dump", workdir / "staged.dump"
    say(f"dumping schema {schema_name} from the source")
    # A quoted pattern is the exact name (no wildcard, no case folding); --strict-names fails on none.
    _pg("pg_dump", "-Fc", "--strict-names", "-n", f'"{schema_name}"', "-f", str(source_dump), "-d", source)
    scratch = f"tally_restore_{stamp}_{os.getpid()}"
    with psycopg.connect(source, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(scratch)))
    try:
        scratch_dsn = make_conninfo(source, dbname=scratch)
        say(f"restoring it into scratch database {scratch}")
        _pg("pg_restore", "--no-owner", "--no-acl", "--single-transaction", "--exit-on-error", "-d", scratch_dsn, str(source_dump))
        with psycopg.connect(scratch_dsn, autocommit=True) as conn:
            _migrations_match(conn=conn, schema_name=schema_name)
            conn.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(schema_name), sql.Identifier(staging)))
        _pg("pg_dump", "-Fc", "--strict-names", "-n", f'"{staging}"', "-f", str(staged_dump), "-d", scratch_dsn)
    finally:
        with psycopg.connect(source, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(scratch)))
    return staged_dump


def _migrations_match(*, conn: psycopg.Connection[tuple[object, ...]], schema_name: str) -> None:
    """Refuse a copy whose django_migrations is not this code's: one missing a migration has
    tables the code does not expect, one holding a migration this code does not know is from
    a later release. Replaced migrations of a squash are known, their files gone or not (a
    schema migrated before the squash holds them)."""
    rows = conn.execute(sql.SQL("SELECT app, name FROM {}.django_migrations").format(sql.Identifier(schema_name))).fetchall()
    held = {(str(app), str(name)) for app, name in rows}
    loader = MigrationLoader(None, ignore_no_migrations=True)
    known = set(loader.disk_migrations) | {tuple(replaced) for m in loader.disk_migrations.values() for replaced in m.replaces}
    missing = sorted(migrations_on_disk() - held)
    unknown = sorted(held - known)
    if missing or unknown:
        raise TenantRestoreRefused(
            f"the source's {schema_name!r} does not hold this code's migrations: missing {len(missing)} {missing[:5]}, "
            f"unknown {len(unknown)} {unknown[:5]}; restore it with the release it was written by, or migrate a copy first"
        )


def _staged_check(*, tenant: Tenant, staging: str) -> tuple[str, ...]:
    """Ask the apps above (reconciliation) to check the staging schema, the connection set
    to a stand-in of the tenant whose schema is the staging one."""
    stand_in = copy.copy(tenant)
    stand_in.schema_name = staging
    with tenant_context(stand_in):
        answers = tenant_restore_staged.send(sender=Tenant, tenant=stand_in)
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    # django-stubs types a receiver's answer as str | None; ours are StagedCheck.
    checks: list[StagedCheck] = [answer for _, answer in cast(list[tuple[Any, object]], answers) if isinstance(answer, StagedCheck)]
    if not checks:
        raise TenantRestoreRefused("nothing checked the restored schema (no receiver of tenant_restore_staged): refusing to swap it in")
    blocking = [line for check in checks for line in check.blocking]
    if blocking:
        raise TenantRestoreRefused(f"the restored schema does not reconcile ({len(blocking)} finding(s)): " + "; ".join(blocking[:10]))
    return tuple(line for check in checks for line in check.notes)


@contextmanager
def _run_lock(*, schema_name: str) -> Iterator[None]:
    """One run (or cleanup) of a tenant at a time: a session advisory lock on the live
    database, tried, held until the run ends (or its connection does)."""
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", [_RUN_LOCK_SPACE, schema_name])
        if not cursor.fetchone()[0]:
            raise TenantRestoreRefused(f"another tenant_restore of {schema_name!r} is running: wait for it to end")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [_RUN_LOCK_SPACE, schema_name])


def _leftover_schemas(*, schema_name: str) -> list[str]:
    """The `<schema>_restoring_<stamp>` and `<schema>_replaced_<stamp>` schemas in the live database."""
    pattern = f"^{re.escape(schema_name)}_(restoring|replaced)_[0-9]{{14}}$"
    with connection.cursor() as cursor:
        cursor.execute("SELECT nspname FROM pg_namespace WHERE nspname ~ %s ORDER BY 1", [pattern])
        return [str(name) for (name,) in cursor.fetchall()]


def _lock_timeout_set(cursor: Any, *, lock_timeout_ms: int) -> None:
    # Set before the first lock of the transaction, the tenant's row included.
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(lock_timeout_ms)}ms"])


def _tenant_row_lock(*, tenant: Tenant) -> bool:
    """The tenant's row, locked FOR NO KEY UPDATE: two runs' switches exclude each other, while
    a payment's commit inserting a due-work row (FOR KEY SHARE on it) goes through. Returns
    is_active as it is now: the operator may have changed it since the run started."""
    return bool(Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("is_active", flat=True).get())


def _lock_refused(exc: BaseException, *, lock_timeout_ms: int) -> TenantRestoreRefused | None:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    why = _LOCK_REFUSALS.get(str(getattr(cause, "sqlstate", "") or ""))
    if why is None:
        return None
    return TenantRestoreRefused(f"the tenant's tables {why} {lock_timeout_ms} ms: nothing swapped; run it again")


def _switch_off(*, tenant: Tenant, staging: str, lock_timeout_ms: int) -> None:
    """Switch the tenant off, committed, if it is on now, and mark `staging` as switched off
    by this run in the same commit. Hosts stop serving the tenant once their cache expires
    (TENANT_CACHE_SECONDS), beat fans no work out to it meanwhile."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            _lock_timeout_set(cursor, lock_timeout_ms=lock_timeout_ms)
            if _tenant_row_lock(tenant=tenant):
                _active_set(tenant=tenant, active=False)
                cursor.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(sql.Identifier(staging), sql.Literal(_SWITCHED_OFF_MARKER))
                               .as_string(None))
    except Exception as exc:
        refused = _lock_refused(exc, lock_timeout_ms=lock_timeout_ms)
        if refused is None:
            raise
        raise refused from exc


def _staging_discard(*, tenant: Tenant, staging: str, lock_timeout_ms: int) -> bool:
    """Drop a staging schema that is not to be swapped in, first switching the tenant on again
    if the schema's marker says its run switched it off and it is still off. Returns whether
    it switched the tenant on."""
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    switched_on = False
    with transaction.atomic(), connection.cursor() as cursor:
        _lock_timeout_set(cursor, lock_timeout_ms=lock_timeout_ms)
        cursor.execute("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", [staging])
        row = cursor.fetchone()
        if row is not None and row[0] == _SWITCHED_OFF_MARKER and not _tenant_row_lock(tenant=tenant):
            _active_set(tenant=tenant, active=True)
            switched_on = True
        cursor.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(staging)).as_string(None))
    return switched_on


def _swap(*, tenant: Tenant, staging: str, replaced: str, lock_timeout_ms: int) -> tuple[bool, tuple[str, ...]]:
    """The swap; returns whether a live schema was renamed aside, and notes."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            _lock_timeout_set(cursor, lock_timeout_ms=lock_timeout_ms)
            _tenant_row_lock(tenant=tenant)
            cursor.execute("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", [staging])
            switched_off = cursor.fetchone()[0] == _SWITCHED_OFF_MARKER
            had_live = bool(schema_exists(tenant.schema_name))
            notes: tuple[str, ...] = ()
            if had_live:
                # Waits for the tenant's transactions in flight (they hold their tables' locks
                # until they end); a statement queued behind this lock looks its table's name
                # up again once it gets the lock, so it runs on the restored table.
                cursor.execute(
                    "SELECT string_agg(format('%%I.%%I', n.nspname, c.relname), ', ' ORDER BY c.oid)"
                    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
                    [tenant.schema_name],
                )
                (tables,) = cursor.fetchone()
                if tables:
                    cursor.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
                notes = _credentials_carry(cursor, live=str(tenant.schema_name), staging=staging)
                cursor.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(tenant.schema_name), sql.Identifier(replaced))
                               .as_string(None))
            else:
                notes = ("the live schema was gone: API keys revoked and logins deactivated after the instant are live again;"
                         " revoke and deactivate them again",)
            cursor.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(staging), sql.Identifier(tenant.schema_name))
                           .as_string(None))
            cursor.execute(sql.SQL("COMMENT ON SCHEMA {} IS NULL").format(sql.Identifier(tenant.schema_name)).as_string(None))
            with schema_context(tenant.schema_name):
                # Events unpublished and top-ups unfinished at the restore point are picked
                # up by the next beat instead of waiting for the safety sweep.
                now = timezone.now()
                due_work_mark(kind=DueWorkKind.RELAY, due_at=now)
                due_work_mark(kind=DueWorkKind.TOPUPS, due_at=now)
            if switched_off:
                _active_set(tenant=tenant, active=True)
    except Exception as exc:
        refused = _lock_refused(exc, lock_timeout_ms=lock_timeout_ms)
        if refused is None:
            raise
        raise refused from exc
    finally:
        connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    return had_live, notes


def _credentials_carry(cursor: Any, *, live: str, staging: str) -> tuple[str, ...]:
    """What the live schema revoked since the instant stays revoked in the copy (the live
    tables are locked, so this is their final state): API keys revoked or deleted there are
    revoked, logins deactivated, deleted or no longer staff there are deactivated (the
    trigger of wallets migration 0015 revokes their staff keys in the copy), passwords are
    the live ones, and sessions the live schema no longer has are dropped. Webhook signing
    secrets rotated since are not carried: the notes say so (docs/RELIABILITY.md)."""
    ids = {"live": sql.Identifier(live), "staging": sql.Identifier(staging)}
    statements = {
        "API key(s) revoked": """
            WITH revoked AS (
                UPDATE {staging}.wallets_apikey s
                   SET revoked_at = coalesce((SELECT l.revoked_at FROM {live}.wallets_apikey l WHERE l.id = s.id), now())
                 WHERE s.revoked_at IS NULL AND NOT EXISTS (SELECT 1 FROM {live}.wallets_apikey l WHERE l.id = s.id AND l.revoked_at IS NULL)
                RETURNING s.id, s.prefix, s.revoked_at
            ) INSERT INTO {staging}.wallets_auditentry (created, actor, action, target_type, target_id, before, after, reason, via, ip, request_id)
              SELECT now(), 'tenant_restore', 'api_key.revoke', 'api_key', id, jsonb_build_object('prefix', prefix, 'revoked_at', NULL),
                     jsonb_build_object('revoked_at', revoked_at), 'revoked in the live schema after the restore point', 'system', NULL, ''
                FROM revoked ORDER BY id""",
        "login(s) deactivated": """
            UPDATE {staging}.auth_user s SET is_active = false
             WHERE s.is_active
               AND NOT EXISTS (SELECT 1 FROM {live}.auth_user l WHERE l.id = s.id AND l.is_active AND (l.is_staff OR NOT s.is_staff))""",
        "password(s) set to the live one": """
            UPDATE {staging}.auth_user s SET password = l.password FROM {live}.auth_user l WHERE l.id = s.id AND s.password <> l.password""",
        "session(s) ended": """
            DELETE FROM {staging}.django_session s WHERE NOT EXISTS (SELECT 1 FROM {live}.django_session l WHERE l.session_key = s.session_key)""",
    }
    carried = []
    for what, statement in statements.items():
        cursor.execute(sql.SQL(statement).format(**ids).as_string(None))
        if cursor.rowcount:
            carried.append(f"{cursor.rowcount} {what}")
    notes = [f"revoked in the live schema since the instant, carried into the restored one: {', '.join(carried)}"] if carried else []
    notes.append("webhook signing secrets are the instant's: any rotated since must be rotated again")
    return tuple(notes)


def _active_set(*, tenant: Tenant, active: bool) -> None:
    # An UPDATE, not Tenant.save(): django-tenants' save creates the schema of a saved tenant
    # that has none (an empty one, cloned from the template) where the swap is to put its own.
    # This process's host cache is cleared as a save clears it; the others' expire.
    Tenant.objects.filter(pk=tenant.pk).update(is_active=active)
    tenant.is_active = active
    tenant_cache_clear()
    transaction.on_commit(tenant_cache_clear)


def _schema_drop(*, schema: str) -> None:
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)).as_string(None))


def _tables_count(*, schema: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                       [schema])
        return int(cursor.fetchone()[0])


def _live_dsn() -> str:
    """The live database as Django connects to it (hosts, target_session_attrs, timeouts: the
    libpq ones of its connection parameters); the password goes through the environment."""
    libpq = {bytes(option.keyword).decode() for option in psycopg.pq.Conninfo.get_defaults()}
    params = connection.get_connection_params()
    return make_conninfo("", **{k: v for k, v in params.items() if k in libpq and k != "password" and v not in (None, "")})


def _live_env() -> dict[str, str]:
    password = connection.settings_dict.get("PASSWORD")
    return {"PGPASSWORD": str(password)} if password else {}


def _pg(program: str, *args: str, env: dict[str, str] | None = None) -> None:
    binary = Path(settings.TALLY_PG_BIN_DIR) / program
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise TenantRestoreRefused(f"{program} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
