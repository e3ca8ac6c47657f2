"""Proof that the squashed `payments` migrations keep databases migrated with the old chain
working: the same schema either way.

    python tests/tools/payments_squash_proof.py [--old-commit SHA] [--keep]

1. Exports the code before the squash (default: the parent of the commit that added it)
   with `git archive`.
2. Database "old": that code migrates it (public schema, the tenant template) and creates a
   tenant by running every migration (not by its clone, whose drift is not the squash's);
   then this checkout's code runs `migrate_schemas` on it, as an upgrade does.
3. Database "new": this checkout's code migrates a fresh database and creates the same tenant.
4. Compares `pg_dump --schema-only` of the tenant's schema and of the template, and checks
   that the squash is recorded as applied on the upgraded database, that its payments
   migrations have nothing left to run, and that no dropped PL/pgSQL function exists.

Prints the comparison and exits 0 when the schemas are identical, 1 otherwise. Needs
PostgreSQL (DATABASE_URL's server, default postgres@127.0.0.1:5432), pg_dump and git.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
SQUASH = "0001_squashed_0009_drop_payment_function"
REMOVED = "payments/migrations/0002_payment_hot_path.py"
DROPPED_FUNCTIONS = "('tally_payment_create', 'tally_customer_reward_credit')"
TENANT = {"schema": "squash_proof", "domain": "squash-proof.localhost", "name": "Squash proof", "currency": "JPY"}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def old_commit_default() -> str:
    """The last commit with the old chain only: the parent of the one that added the squash."""
    adding = _git("log", "--format=%H", "--diff-filter=A", "--", f"payments/migrations/{SQUASH}.py").splitlines()
    if not adding:
        raise SystemExit(f"no commit added {SQUASH}: pass --old-commit")
    return _git("rev-parse", f"{adding[-1]}^")


def export(commit: str, into: Path) -> None:
    archive = into.with_suffix(".tar")
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


class Server:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.user, self.host, self.port = parts.username or "postgres", parts.hostname or "127.0.0.1", str(parts.port or 5432)
        self.password = parts.password or ""

    def url(self, database: str) -> str:
        auth = self.user + (f":{self.password}" if self.password else "")
        return f"postgres://{auth}@{self.host}:{self.port}/{database}"

    def _env(self) -> dict[str, str]:
        return {**os.environ, **({"PGPASSWORD": self.password} if self.password else {})}

    def psql(self, database: str, sql: str) -> str:
        return subprocess.run(["psql", "-h", self.host, "-p", self.port, "-U", self.user, "-d", database, "-XAtc", sql],
                              check=True, capture_output=True, text=True, env=self._env()).stdout.strip()

    def dump(self, database: str, schema: str) -> str:
        return subprocess.run(["pg_dump", "-h", self.host, "-p", self.port, "-U", self.user, "--schema-only", "--no-owner",
                               "--no-privileges", "-n", schema, database], check=True, capture_output=True, text=True, env=self._env()).stdout


def manage(code: Path, database_url: str, *args: str, env_extra: dict[str, str] | None = None) -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "DATABASE_URL": database_url, "TALLY_LOG_LEVEL": "WARNING",
           "PYTHONPATH": str(code), **(env_extra or {})}
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=code, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{code}: manage.py {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def install(code: Path, database_url: str, *, tenant_migrated: bool = False) -> None:
    """What `make run` does before serving: migrate, the platform and its template, a tenant.

    `tenant_migrated`: the tenant runs every migration instead of being cloned from the
    template. The old code's clone (django-tenants' clone_schema) renamed unique
    constraints and changed sequence bounds on the way, which is the clone's drift, not
    the squash's; the current clone is checked against migrations by
    tests/test_tenant_schemas.py."""
    manage(code, database_url, "migrate_schemas", "--shared", "--noinput", "-v", "0")
    # platform_ensure moved from tenants.services (the old code's home) to devtools.demo_seed.
    ensure = "try:\n from devtools.demo_seed import platform_ensure\nexcept ImportError:\n from tenants.services import platform_ensure\n"
    manage(code, database_url, "shell", "-c", ensure + "platform_ensure(public_domain='localhost')")
    manage(code, database_url, "migrate_schemas", "--noinput", "-v", "0")
    if tenant_migrated:
        # Outside tenant_create's transaction: some migrations build indexes concurrently.
        manage(code, database_url, "shell", "-c", f"from tenants.models import Tenant; Tenant(schema_name={TENANT['schema']!r}, "
               f"name={TENANT['name']!r}, main_currency={TENANT['currency']!r}).save()", env_extra={"TENANT_CREATION_FAKES_MIGRATIONS": "false"})
        return
    manage(code, database_url, "create_tenant", "--schema", TENANT["schema"], "--domain", TENANT["domain"], "--name", TENANT["name"],
           "--currency", TENANT["currency"])


def normalised(dump: str) -> list[str]:
    """The dump without comments, settings and blank lines (they carry no schema)."""
    lines = []
    for line in dump.splitlines():
        if not line.strip() or line.startswith(("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict")):
            continue
        lines.append(re.sub(r"\s+$", "", line))
    return lines


def prove(*, old_commit: str, server: Server, keep: bool) -> int:
    run = uuid.uuid4().hex[:8]
    old_db, new_db = f"squash_old_{run}", f"squash_new_{run}"
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="squash-proof-") as tmp:
        old_code = Path(tmp) / "old"
        export(old_commit, old_code)
        assert (old_code / REMOVED).exists(), f"{old_commit} does not have the old chain"
        for db in (old_db, new_db):
            server.psql("postgres", f'CREATE DATABASE "{db}"')
        try:
            print(f"old chain: {old_commit[:12]} -> database {old_db}")
            install(old_code, server.url(old_db), tenant_migrated=True)
            for schema in ("tenant_template", TENANT["schema"]):
                applied = server.psql(old_db, f"SELECT count(*) FROM {schema}.django_migrations WHERE app = 'payments' AND name = '{SQUASH}'")
                assert applied == "0", "the old code knows no squash"
            print("upgrade: this checkout's migrate_schemas on it")
            manage(ROOT, server.url(old_db), "migrate_schemas", "--noinput", "-v", "0")
            print(f"fresh: this checkout -> database {new_db}")
            install(ROOT, server.url(new_db))

            for schema in ("tenant_template", TENANT["schema"]):
                old_lines, new_lines = normalised(server.dump(old_db, schema)), normalised(server.dump(new_db, schema))
                diff = list(difflib.unified_diff(old_lines, new_lines, f"{schema} upgraded from the old chain", f"{schema} fresh", lineterm=""))
                print(f"{schema}: {len(new_lines)} schema lines; {'identical' if not diff else f'{len(diff)} lines of difference'}")
                if diff:
                    failures.append(f"{schema} differs:\n" + "\n".join(diff[:200]))
                recorded = server.psql(old_db, f"SELECT count(*) FROM {schema}.django_migrations WHERE app = 'payments' AND name = '{SQUASH}'")
                print(f"{schema}: squash recorded as applied on the upgraded database: {recorded == '1'}")
                if recorded != "1":
                    failures.append(f"{schema}: {SQUASH} not recorded on the upgraded database")
                for db in (old_db, new_db):
                    functions = server.psql(db, f"SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                                                f"WHERE n.nspname = '{schema}' AND p.proname IN {DROPPED_FUNCTIONS}")
                    if functions != "0":
                        failures.append(f"{db}.{schema}: a dropped payment function exists")
            plan = manage(ROOT, server.url(old_db), "migrate_schemas", "--schema", TENANT["schema"], "--plan")
            print("payments operations left to run on the upgraded tenant:", "none" if "payments." not in plan else plan)
            if "payments." in plan:
                failures.append("migrations left to run on the upgraded tenant:\n" + plan)
        finally:
            if not keep:
                for db in (old_db, new_db):
                    server.psql("postgres", f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    for failure in failures:
        print("FAIL:", failure)
    print("PROOF OK: same schema upgraded from the old chain as migrated fresh" if not failures else "PROOF FAILED")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-commit", help="a commit with the old payments chain (default: found with git log)")
    parser.add_argument("--keep", action="store_true", help="keep the two databases for inspection")
    options = parser.parse_args()
    server = Server(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    return prove(old_commit=options.old_commit or old_commit_default(), server=server, keep=options.keep)


if __name__ == "__main__":
    sys.exit(main())
