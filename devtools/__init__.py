"""Development tooling and test doubles, outside the apps: `make run`'s runner and process
supervisor, the local-services finder, the PgBouncer starter, the PSP simulator, the demo
seed and the demo webhook receiver. Nothing in the apps imports it (pyproject.toml)."""
