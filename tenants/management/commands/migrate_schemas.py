"""django-tenants' `migrate_schemas`, visiting only the tenants with something to migrate
(a query per 500 schemas: tenants.schemas.schemas_missing_migrations; the cost of a
no-op visit: docs/BENCHMARKS.md). `--all-tenants` visits every tenant as django-tenants
does; so does any run that names an app or a target migration, fakes, prunes, checks or
plans, since "holds every migration" is not its question.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django_tenants.management.commands.migrate_schemas import GET_EXECUTOR_FUNCTION, MigrateSchemasCommand
from django_tenants.utils import get_public_schema_name, get_tenant_migration_order, has_multi_type_tenants

from tenants.models import Tenant
from tenants.schemas import schemas_missing_migrations

_FULL_RUN_OPTIONS = ("app_label", "migration_name", "fake", "fake_initial", "prune", "check_unapplied", "plan", "run_syncdb")


class Command(MigrateSchemasCommand):  # type: ignore[misc]  # django-tenants is untyped
    help = MigrateSchemasCommand.help + " Tenants whose django_migrations hold every migration on disk are skipped."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--all-tenants", action="store_true", dest="all_tenants", default=False,
                            help="Visit every tenant, even those with nothing to migrate.")

    def handle(self, *args: Any, **options: Any) -> None:
        skipping = not (options.get("all_tenants") or options.get("schema_name") or options.get("shared")
                        or has_multi_type_tenants() or any(options.get(name) for name in _FULL_RUN_OPTIONS))
        if not skipping:
            super().handle(*args, **options)
            return
        # What MigrateSchemasCommand.handle does for a run over every tenant, with the
        # up-to-date tenants left out of the executor's list.
        super(MigrateSchemasCommand, self).handle(*args, **options)  # SyncCommon: reads the options
        public = get_public_schema_name()
        executor = GET_EXECUTOR_FUNCTION(codename=self.executor)(self.args, self.options)
        if self.sync_public:
            executor.run_migrations(tenants=[public])
        if not self.sync_tenant:
            return
        tenants = Tenant.objects.exclude(schema_name=public)
        order = get_tenant_migration_order()
        if order is not None:
            tenants = tenants.order_by(*order)
        schemas = [str(s) for s in tenants.values_list("schema_name", flat=True)]
        missing = schemas_missing_migrations(schemas=schemas)
        behind = [schema for schema in schemas if missing[schema]]
        if options.get("verbosity", 1) >= 1:
            self.stdout.write(f"migrate_schemas: {len(behind)} of {len(schemas)} tenants to migrate; "
                              f"{len(schemas) - len(behind)} hold every migration and are skipped")
        if behind:
            executor.run_migrations(tenants=behind)
