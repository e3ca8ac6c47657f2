"""The same first migration as bench/tenantcol/migrations (this module replaces that one
through MIGRATION_MODULES and adds 0002)."""

import importlib

Migration = importlib.import_module("bench.tenantcol.migrations.0001_initial").Migration
