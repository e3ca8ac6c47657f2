# Tally: `make run` and `make test` on a fresh clone. See README.md.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test proof lint chromium pgbouncer pgbackrest patroni-servers

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	@touch $(STAMP)

install: $(STAMP)

# Installs, picks PostgreSQL/Redis (env, local servers, or embedded under var/),
# migrates, seeds the demo tenant and starts web, worker and beat.
run: install
	$(BIN)/python -m devtools.run

# The browser test drives Debian's Chromium (never a downloaded browser); installed with apt
# when absent (needs root or sudo).
chromium:
	@test -x /usr/bin/chromium || { echo "installing chromium (apt)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && $$SUDO apt-get install -y chromium; }

# The PgBouncer test (tests/test_pgbouncer.py) starts Debian's pgbouncer (session mode, in
# front of the suite's PostgreSQL); installed with apt when absent (needs root or sudo).
pgbouncer:
	@test -x /usr/sbin/pgbouncer || { echo "installing pgbouncer (apt)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && $$SUDO apt-get install -y pgbouncer; }

# The backup tests (tests/test_backups.py) and bench/bench_backup.py archive and back up with
# Debian's pgBackRest (never a backup script of our own); installed with apt when absent
# (needs root or sudo).
pgbackrest:
	@test -x /usr/bin/pgbackrest || { echo "installing pgbackrest (apt)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && $$SUDO apt-get install -y pgbackrest; }

# The Patroni failover tests (tests/test_patroni_failover.py) start Debian's etcd (etcd-server,
# v3 API) and the HAProxy check runs Debian's haproxy; installed with apt when absent (needs root
# or sudo). Patroni itself comes from requirements-dev.txt.
patroni-servers:
	@test -x /usr/bin/etcd -a -x /usr/sbin/haproxy || { echo "installing etcd-server and haproxy (apt)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && $$SUDO apt-get install -y etcd-server haproxy; }

# Installs, checks ruff (every Python file but the migrations: the apps, devtools/, tests/ and
# bench/), mypy (strict on apikit/, idempotency/, wallets/, payments/, webhooks/, tenants/, config/,
# reconciliation/, fastpath/ and devtools/) and the import-linter layer contracts (pyproject.toml), then runs the
# whole suite against real PostgreSQL and Redis.
test: install chromium pgbouncer pgbackrest patroni-servers
	$(BIN)/ruff check .
	$(BIN)/mypy apikit idempotency wallets payments webhooks tenants config reconciliation fastpath devtools
	$(BIN)/lint-imports --no-logo
	@eval "$$($(BIN)/python -m devtools.localservices --database tally)" && \
	  $(BIN)/python -m pytest -n $${TEST_WORKERS:-2} $(PYTEST_ARGS)

# The fault suite in its long form (docs/RELIABILITY.md): processes killed with SIGKILL under
# payments, Redis stopped and started, PostgreSQL sessions ended, a primary killed and its
# synchronous standby promoted, a webhook receiver down then up. Every fault lands on a
# process or server the tests start (their own Redis and PostgreSQL pair); each scenario
# prints a line of figures, gathered at the end. Needs PostgreSQL's server binaries
# (initdb, pg_ctl, pg_basebackup) and redis-server, as `make test` does.
proof: install pgbackrest patroni-servers
	@eval "$$($(BIN)/python -m devtools.localservices --database tally)" && \
	  $(BIN)/python -m pytest -n $${TEST_WORKERS:-2} -m proof --long $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy apikit idempotency wallets payments webhooks tenants config reconciliation fastpath devtools
	$(BIN)/lint-imports --no-logo
