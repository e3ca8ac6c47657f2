"""A bench-only tenant app (bench/bench_tenants.py, settings bench.tenants_settings): one
small table in every tenant schema, so the bench can time one real migration that adds a
column across all tenants without touching the project's own migrations. Its migrations
module is chosen by TALLY_BENCH_COLUMN_MIGRATIONS: `migrations` (the table) or
`migrations_column` (the table, then a column added)."""
