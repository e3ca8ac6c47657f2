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
import subprocess
import tempfile
import time
from collections.abc import Callable
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
    transaction: the live schema (if it still exists) becomes `<schema>_replaced_<stamp>`,
    dropped after the commit unless `keep_replaced`; staging becomes `<schema>`.

    Locks: the tenant's public row FOR UPDATE and ACCESS EXCLUSIVE on every table of the
    live schema, for the swap's instant only, waiting at most `lock_timeout_ms` (then
    refused, nothing swapped). Other tenants' tables are never locked. Before the swap the
    tenant is switched off (committed), so beat sends it no work and hosts stop serving it
    once their cache expires; its previous state is back in the swap's own commit.
    """
    say = progress or (lambda _: None)
    tenant = _tenant_restorable(schema_name=schema_name)
    stamp = timezone.now().strftime("%Y%m%d%H%M%S")
    staging, replaced = f"{schema_name}_restoring_{stamp}", f"{schema_name}_replaced_{stamp}"
    if len(replaced) > _NAME_MAX:
        raise TenantRestoreRefused(f"schema name {schema_name!r} is too long for a staging name ({replaced!r} is over {_NAME_MAX})")
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
        say(f"swapping {staging} in as {schema_name}")
        had_live = _swap(tenant=tenant, staging=staging, replaced=replaced, lock_timeout_ms=lock_timeout_ms)
        swapped = True
    finally:
        if not swapped:  # refused, failed or a dry run: the staging schema goes
            _schema_drop(schema=staging)
    seconds["swapped"] = round(time.monotonic() - started, 3)
    tenant_restored.send(sender=Tenant, schema_name=schema_name)
    if had_live and not keep_replaced:
        say(f"dropping {replaced}")
        _schema_drop(schema=replaced)
        seconds["replaced dropped"] = round(time.monotonic() - started, 3)
    return TenantRestoreReport(schema_name=schema_name, dry_run=False, staging_schema=staging, replaced_schema=replaced if had_live else None,
                               replaced_kept=had_live and keep_replaced, tables=tables, notes=notes, seconds=seconds)


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


def _swap(*, tenant: Tenant, staging: str, replaced: str, lock_timeout_ms: int) -> bool:
    """The swap; returns whether a live schema was renamed aside."""
    was_active = bool(tenant.is_active)
    if was_active:
        # Committed before the swap waits for locks: hosts stop serving the tenant once their
        # cache expires (TENANT_CACHE_SECONDS), beat fans no work out to it meanwhile.
        _active_set(tenant=tenant, active=False)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(lock_timeout_ms)}ms"])
            had_live = bool(schema_exists(tenant.schema_name))
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
                cursor.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(tenant.schema_name), sql.Identifier(replaced))
                               .as_string(None))
            cursor.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(staging), sql.Identifier(tenant.schema_name))
                           .as_string(None))
            with schema_context(tenant.schema_name):
                # Events unpublished and top-ups unfinished at the restore point are picked
                # up by the next beat instead of waiting for the safety sweep.
                now = timezone.now()
                due_work_mark(kind=DueWorkKind.RELAY, due_at=now)
                due_work_mark(kind=DueWorkKind.TOPUPS, due_at=now)
            if was_active:
                _active_set(tenant=tenant, active=True)
    except BaseException as exc:
        if was_active:
            _active_set(tenant=tenant, active=True)
        if "lock timeout" in str(exc):
            raise TenantRestoreRefused(f"the tenant's tables stayed busy past {lock_timeout_ms} ms: nothing swapped; run it again") from exc
        raise
    finally:
        connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    return had_live


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
