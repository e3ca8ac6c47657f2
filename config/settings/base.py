"""Settings shared by every environment. Every value is read through django-environ."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()
_env_file = BASE_DIR / ".env"
if _env_file.exists():
    environ.Env.read_env(str(_env_file))

SECRET_KEY = env("DJANGO_SECRET_KEY", default="insecure-local-only-key")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["*"])

# --- Tenancy (django-tenants: one PostgreSQL schema per tenant) -------------------
SHARED_APPS = [
    # `tenants` precedes django_tenants so our create_tenant command wins over its own.
    "tenants",
    "django_tenants",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "config.admin_site.TallyAdminConfig",  # django.contrib.admin with the dashboard on its index
    "django.contrib.staticfiles",
    "django_celery_beat",
    "rest_framework",
    "drf_spectacular",
    # Swagger UI / Redoc assets served as our own static files (/v1/docs works offline).
    "drf_spectacular_sidecar",
    # Admin login throttling; its tables live in every schema (platform and tenant logins).
    "axes",
]
TENANT_APPS = [
    # Each tenant has its own staff users, sessions and admin log.
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "config.admin_site.TallyAdminConfig",  # django.contrib.admin with the dashboard on its index
    "axes",
    "wallets",
    "payments",
    "idempotency",
    "webhooks",
    "reconciliation",
]
INSTALLED_APPS = list(SHARED_APPS) + [a for a in TENANT_APPS if a not in SHARED_APPS]

TENANT_MODEL = "tenants.Tenant"
TENANT_DOMAIN_MODEL = "tenants.Domain"
PUBLIC_SCHEMA_URLCONF = "config.urls_public"
ROOT_URLCONF = "config.urls"
# New tenants are cloned from a migrated template schema: a full migration run per
# tenant takes seconds, a clone well under one (see docs/BENCHMARKS.md). The clone is
# tenants.schemas (Tenant.create_schema), not django-tenants' clone_schema.
TENANT_BASE_SCHEMA = "tenant_template"
TENANT_CREATION_FAKES_MIGRATIONS = env.bool("TENANT_CREATION_FAKES_MIGRATIONS", default=True)
SHOW_PUBLIC_IF_NO_TENANT_FOUND = False
# Issue `SET search_path` once per connection and tenant switch instead of before every
# statement. Safe: django-tenants forgets the cached path on set_tenant, rollback,
# savepoint rollback and close, so it is re-issued whenever the database may have lost it.
TENANT_LIMIT_SET_CALLS = env.bool("TENANT_LIMIT_SET_CALLS", default=True)
# Host -> tenant lookups are cached in each process this long (tenants/middleware.py).
TENANT_CACHE_SECONDS = env.float("TENANT_CACHE_SECONDS", default=10.0)
# Live API keys are cached per process at most this long (wallets.keycache; 0 turns the
# cache off): ~0.7 ms of CPU and two statements a request saved. A hit is trusted only
# while the tenant's API key epoch in Redis is unchanged (wallets.keycache), and revoke and
# rotate bump it after commit, so they hold on the next request in every process. This
# TTL only bounds the rare case of a bump Redis did not take while it still answers reads
# (counted in tally_api_key_epoch_bump_failures_total); with 30 s a key used steadily is
# re-read from PostgreSQL once per 30 s per process.
TALLY_API_KEY_CACHE_SECONDS = env.float("TALLY_API_KEY_CACHE_SECONDS", default=30.0)

DATABASES = {"default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/tally")}
DATABASES["default"]["ENGINE"] = "fastpath.backend"  # django-tenants', with prepared statements (fastpath.prepared)
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=3))
# DATABASE_URL may name several hosts, libpq's way (docs/RELIABILITY.md):
# postgres://u@h1:5432,h2:5432/tally?target_session_attrs=read-write. django-environ hands
# libpq the host and port lists as they are; libpq tries each in turn (connect_timeout
# each) and keeps the one that takes writes, so a new connection finds the promoted node.
# A connection to a node that vanished without a reset (a dead machine, a cut network)
# would wait on TCP's defaults (hours): keepalives end it in about 20 s instead. No
# statement_timeout: cancelling a COMMIT that waits for the synchronous standby reports it
# committed, on the primary alone (PostgreSQL's "canceling wait for synchronous replication").
for _option, _default in (("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 3), ("keepalives_count", 3)):
    DATABASES["default"]["OPTIONS"].setdefault(_option, env.int(f"DATABASE_{_option.upper()}", default=_default))
# The payment path's hot statements go as server-side prepared statements, parsed and
# planned once per connection (fastpath/prepared.py). Turn off behind a
# pooler that does not keep a server session per client (pgbouncer in transaction mode).
TALLY_DB_PREPARED_STATEMENTS = env.bool("TALLY_DB_PREPARED_STATEMENTS", default=True)
DATABASE_ROUTERS = ("django_tenants.routers.TenantSyncRouter",)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "fastpath.rediscache.ReusingRedisCache",  # Django's, one redis-py client per pool
        "LOCATION": REDIS_URL,
        # Per-tenant key prefix: tenant A can never read tenant B's cache entries.
        "KEY_FUNCTION": "django_tenants.cache.make_key",
        "REVERSE_KEY_FUNCTION": "django_tenants.cache.reverse_key",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }
}

MIDDLEWARE = [
    # Static files first: answered by whitenoise with no tenant lookup or database.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.observability.RequestIdMiddleware",
    "config.health.HealthMiddleware",
    "config.middleware.ApiErrorEnvelopeMiddleware",
    "config.middleware.FailClosedTenantMiddleware",
    "config.observability.MetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Who and from where, for the audit log (wallets.audit); after authentication.
    "config.middleware.AuditOriginMiddleware",
    # Refuses logins while an address/user pair is locked out (after the session user is known).
    "axes.middleware.AxesMiddleware",
]
AUTHENTICATION_BACKENDS = [
    "config.auth_backends.LoginThrottleBackend",  # django-axes: refuses locked-out logins
    "django.contrib.auth.backends.ModelBackend",
]
# Admin login throttling (django-axes): 5 failures for one username from one address lock
# that pair out for 15 minutes. Counted in the schema of the host (tenant or platform).
AXES_FAILURE_LIMIT = env.int("TALLY_ADMIN_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("TALLY_ADMIN_LOGIN_COOLOFF_HOURS", default=0.25)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "config.wsgi.application"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
# `make run` collects static files here; gunicorn serves them through whitenoise.
STATIC_ROOT = env.path("TALLY_STATIC_ROOT", default=BASE_DIR / "var" / "static")
# Without a collectstatic run (tests, a fresh checkout), whitenoise can serve straight
# from the apps' static folders; production collects and turns this off.
WHITENOISE_USE_FINDERS = env.bool("TALLY_STATIC_USE_FINDERS", default=True)
WHITENOISE_AUTOREFRESH = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("TALLY_MAX_BODY_BYTES", default=64 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "apikit.schema.TallyAutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "COERCE_DECIMAL_TO_STRING": True,
    # One error envelope for every face (SPEC 5), DRF's own errors included.
    "EXCEPTION_HANDLER": "apikit.errors.api_exception_handler",
    # Counted in Redis per API key and per tenant (apikit/throttling.py); a tenant
    # may override them in Tenant.extra_settings["throttle_rates"].
    "DEFAULT_THROTTLE_RATES": {
        "api_key": env("TALLY_THROTTLE_KEY_RATE", default="6000/min"),
        "tenant": env("TALLY_THROTTLE_TENANT_RATE", default="60000/min"),
        # Failed authentications, per client IP and per presented key prefix.
        "auth_failure": env("TALLY_THROTTLE_AUTH_FAILURE_RATE", default="60/min"),
    },
    # How many reverse proxies in front of gunicorn append to X-Forwarded-For. Unset, the
    # header is ignored (a client could write any address into it) and REMOTE_ADDR counts.
    "NUM_PROXIES": env.int("TALLY_NUM_PROXIES", default=None),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tally API",
    "DESCRIPTION": "Multi-tenant wallets and payments. See SPEC.md for the contract.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/v1",
    "SECURITY": [{"bearerAuth": []}],
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "apikit.schema.links_add"],
    # Assets from drf-spectacular-sidecar (static files), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery (tenant-schemas-celery carries the schema on every task) ---------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# Celery configured for money (docs/WEBHOOKS.md "Celery"). Every Tally task is safe to run
# twice (the relay is at least once, publication and deliveries are keyed), and none may
# be lost, so:
# - Acknowledge a message after the task ran, not when a worker took it: a worker that
#   dies mid-task (OOM, SIGKILL, deploy) leaves the message to be delivered again.
CELERY_TASK_ACKS_LATE = True
# - ...and when the pool child running it dies, hand the message back at once rather than
#   acknowledging it as failed.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# - Prefetch one message per process: a slow relay must not sit on messages another
#   worker could run, and a crash returns at most one.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# - Time limits: the relay stops taking work after its own 60 s budget; the soft limit
#   (SoftTimeLimitExceeded) lets a stuck one unwind and roll back, the hard limit kills it.
#   Whatever it did not finish is rolled back and picked up by the next run.
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=120)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=180)
# - Redis redelivers an unacknowledged message after the visibility timeout. A countdown
#   or ETA longer than it would be delivered again (and again) before it is due, so Tally
#   never schedules retries with countdown/eta: retries (outbox, webhooks) are rows with a
#   due time that the beat sweep reads. The one countdown is a relay kick's, at most
#   RELAY_MIN_INTERVAL_MS (payments.services.outbox). The timeout only has to outlast the
#   hard time limit.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker outage of any length: the worker keeps trying to reconnect (every 2 s more, up
# to 30 s apart) rather than exiting after Celery's default 100 tries (docs/RELIABILITY.md).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Queues by concern, each consumed (and scaled) on its own: a long reconciliation run or a
# retry storm to a dead endpoint cannot hold up a fresh payment's webhook. A worker started
# without -Q consumes all of them (the Procfile names them; it says how to split them).
# - relay: the relay runs a commit kicks (publish the new events, send their deliveries);
# - webhooks: the relay runs beat sends (retries come due, events a lost kick left);
# - recovery: card top-up recovery (PSP calls);
# - reconciliation: reconciliation runs (whole-ledger reads, up to RUN_TIME_LIMIT_SECONDS);
# - celery: everything else (beat's fan-outs, the idempotency purge). Celery's own default
#   name, kept so that messages an older release left there still find a consumer.
CELERY_TASK_QUEUES = {name: {"exchange": name, "routing_key": name} for name in ("celery", "relay", "webhooks", "recovery", "reconciliation")}
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_ROUTES = {
    "webhooks.outbox_relay": {"queue": "relay"},
    "webhooks.relay_scheduled": {"queue": "webhooks"},
    "payments.topups_recover_tenant": {"queue": "recovery"},
    "reconciliation.run_tenant": {"queue": "reconciliation"},
}
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # keep the JSON logging config in workers
# A task finds its tenant by schema name (tenant-schemas-celery): a query per task unless
# cached. Cached for TENANT_CACHE_SECONDS, whole seconds, like the web's host -> tenant
# cache; unlike it, not cleared when a tenant is saved (a worker sees the change within it).
CELERY_TASK_TENANT_CACHE_SECONDS = int(TENANT_CACHE_SECONDS)
# Beat entries (synced into django_celery_beat by the DatabaseScheduler); add yours by key.
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
# Idempotency retention: purge records past replay + tombstone windows, per tenant.
CELERY_BEAT_SCHEDULE["idempotency-purge"] = {"task": "idempotency.purge_all_tenants", "schedule": 600.0}
# The outbox relay in the tenants with relay work due (tenants.duework): every event an
# after-commit kick missed and the webhook retries that have come due (SPEC 8). Then the
# safety sweep of every tenant, which bounds what a missing due-work row can delay.
CELERY_BEAT_SCHEDULE["webhooks-relay"] = {"task": "webhooks.relay_due_tenants", "schedule": 10.0}
# Every writer marks its due work in its own transaction, so the sweeps only catch a row
# lost to a bug or deleted by hand. Each visits every tenant, so their period is what
# they cost at many tenants (docs/BENCHMARKS.md, "A thousand tenants"). At most an hour:
# reconciliation reports a card charge not given back within an hour.
TALLY_SAFETY_SWEEP_SECONDS = env.int("TALLY_SAFETY_SWEEP_SECONDS", default=1800)
if not 60 <= TALLY_SAFETY_SWEEP_SECONDS <= 3600:
    raise ImproperlyConfigured("TALLY_SAFETY_SWEEP_SECONDS must be whole seconds from 60 to 3600")
CELERY_BEAT_SCHEDULE["webhooks-relay-sweep"] = {"task": "webhooks.relay_all_tenants", "schedule": TALLY_SAFETY_SWEEP_SECONDS}

# --- Observability ----------------------------------------------------------------
LOG_LEVEL = env("TALLY_LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "config.observability.LogContextFilter"}},
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(client_request_id)s %(tenant)s",
            "rename_fields": {"asctime": "ts", "levelname": "level", "name": "logger"},
        }
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["context"]}
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Tally --------------------------------------------------------------------------
TALLY_DEMO_DOMAIN = env("TALLY_DEMO_DOMAIN", default="demo.localhost")
TALLY_PUBLIC_DOMAIN = env("TALLY_PUBLIC_DOMAIN", default="localhost")
# /metrics answers to `Authorization: Bearer <this>` on any host, and (not in production:
# anyone can send the platform's Host header to a shared server) on the platform host.
TALLY_METRICS_TOKEN = env("TALLY_METRICS_TOKEN", default="")
TALLY_METRICS_ON_PLATFORM_HOST = env.bool("TALLY_METRICS_ON_PLATFORM_HOST", default=True)
# An unknown tenant host answers a plain 404 (the envelope on /v1/) naming nothing internal.
DEFAULT_NOT_FOUND_TENANT_VIEW = "config.middleware.tenant_not_found"
# Webhook targets (webhooks/targets.py): plain http and loopback addresses are refused
# unless these say otherwise (local development sets both; never in production).
TALLY_WEBHOOK_ALLOW_HTTP = env.bool("TALLY_WEBHOOK_ALLOW_HTTP", default=DEBUG)
TALLY_WEBHOOK_ALLOW_LOOPBACK = env.bool("TALLY_WEBHOOK_ALLOW_LOOPBACK", default=False)
# Kick the outbox relay after each commit that wrote an event (low latency). Off, the beat
# sweep alone relays (every 10 s): e.g. while the broker is being moved.
TALLY_OUTBOX_RELAY_KICK = env.bool("TALLY_OUTBOX_RELAY_KICK", default=True)
# Test-only: the relay sleeps this long holding a claimed batch (the SIGKILL test). 0 = off.
TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS = env.float("TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS", default=0.0)

# --- Card top-ups and PSPs (payments/services/topup_saga.py) -------------------------
# The inline PSP call's timeout, and the lease of a top-up's idempotency claim: the lease
# must outlast the call, so only a crashed or stalled holder's claim is ever taken over.
TALLY_PSP_TIMEOUT_SECONDS = env.float("TALLY_PSP_TIMEOUT_SECONDS", default=10.0)
TALLY_TOPUP_LEASE_SECONDS = env.int("TALLY_TOPUP_LEASE_SECONDS", default=30)
# Each of the three loops of a top-up recovery pass (refunds, orphaned claims, pending
# top-ups) takes records for at most this many seconds, then leaves the rest to the next
# pass (payments/services/topup_budget.py). Each loop may overrun its budget by the one PSP
# call in hand, and the purge and settle come after: all of it must end inside the task's
# soft time limit, or the pass is killed before its settle (and, before, its refunds).
# Unset, it is derived from that limit (25 s at the defaults); set, it is checked against it.
# The recovery task has time limits of its own (CELERY_TASK_ANNOTATIONS below), so a short
# global limit (for the relay) never starves it, and its budgets are checked against them.
TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT = env.int("TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT", default=120)
TALLY_TOPUP_RECOVERY_TIME_LIMIT = env.int("TALLY_TOPUP_RECOVERY_TIME_LIMIT", default=180)
if TALLY_TOPUP_RECOVERY_TIME_LIMIT <= TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured("TALLY_TOPUP_RECOVERY_TIME_LIMIT must be above TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT")
CELERY_TASK_ANNOTATIONS = {
    "payments.topups_recover_tenant": {
        "soft_time_limit": TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT, "time_limit": TALLY_TOPUP_RECOVERY_TIME_LIMIT,
    },
}
TOPUP_RECOVERY_LOOPS = 3
TOPUP_RECOVERY_TAIL_SECONDS = 15  # purge, gauges, the due-work settle
_topup_loop_fit = (TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT - TOPUP_RECOVERY_TAIL_SECONDS) / TOPUP_RECOVERY_LOOPS - TALLY_PSP_TIMEOUT_SECONDS
_topup_loop_set = env("TALLY_TOPUP_RECOVERY_LOOP_SECONDS", default="")
if not _topup_loop_set:
    # A soft limit too short for a pass has no budget to give: refuse to start rather than
    # round it up to one that overruns the limit (the pass killed before its settle).
    if _topup_loop_fit < 1.0:
        raise ImproperlyConfigured(
            "TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT is too short for a top-up recovery pass: it must be at least"
            f" 3 x (1 s + TALLY_PSP_TIMEOUT_SECONDS) + 15 s ({3 * (1 + TALLY_PSP_TIMEOUT_SECONDS) + TOPUP_RECOVERY_TAIL_SECONDS:g} s now)"
        )
    TALLY_TOPUP_RECOVERY_LOOP_SECONDS = _topup_loop_fit
else:
    TALLY_TOPUP_RECOVERY_LOOP_SECONDS = float(_topup_loop_set)
    if not 0 < TALLY_TOPUP_RECOVERY_LOOP_SECONDS <= _topup_loop_fit:
        raise ImproperlyConfigured(
            "TALLY_TOPUP_RECOVERY_LOOP_SECONDS: 3 x (it + TALLY_PSP_TIMEOUT_SECONDS) + 15 s must fit in TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT"
            f" (at most {_topup_loop_fit:g} s now)"
        )
# One deadline for the whole pass: each loop's budget is the smaller of its own and the
# time left in the pass, so loops that each stay in budget cannot add up past the soft limit.
TALLY_TOPUP_RECOVERY_PASS_SECONDS = max(0.0, TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT - TOPUP_RECOVERY_TAIL_SECONDS - TALLY_PSP_TIMEOUT_SECONDS)
# Test-only: the saga sleeps this long between the PSP's answer and the completion (the SIGKILL test). 0 = off.
TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS = env.float("TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS", default=0.0)
# Recovery of card top-ups left unknown (crash, timeout), in the tenants with recovery
# work due (tenants.duework), then the safety sweep of every tenant.
CELERY_BEAT_SCHEDULE["topups-recover"] = {"task": "payments.topups_recover_due_tenants", "schedule": 10.0}
CELERY_BEAT_SCHEDULE["topups-recover-sweep"] = {"task": "payments.topups_recover_all_tenants", "schedule": TALLY_SAFETY_SWEEP_SECONDS}

# Sealing keys (wallets/sealing.py): PSP credentials, webhook signing secrets and stored
# one-time secrets are sealed under a ring of keys of their own, never derived from
# SECRET_KEY: "<id>:<base64 of 32 random bytes>", comma-separated, the first seals and every
# one opens. Missing or malformed: a system check error (wallets/checks.py). Local runs
# read var/sealing_keys (written by `make run`), tests a fixed ring. Values sealed by an
# older release (under SECRET_KEY) open only while the old SECRET_KEY is set here too;
# `manage.py secrets_reseal` then re-seals them and it can be unset.
TALLY_SEALING_KEYS = env.list("TALLY_SEALING_KEYS", default=[])
TALLY_SEALING_LEGACY_SECRET_KEY = env("TALLY_SEALING_LEGACY_SECRET_KEY", default="")

# Contact data encrypted at rest (wallets.contacts): Fernet keys, newest first. MultiFernet
# encrypts with the first and decrypts with any, so a key is rotated by putting a new one in
# front (old tokens still read). The lookup hash is HMAC-SHA256 under its own key. Local and
# test runs derive both from SECRET_KEY; production requires them (production.py).
TALLY_CONTACT_ENCRYPTION_KEYS = env.list(
    "TALLY_CONTACT_ENCRYPTION_KEYS",
    default=[base64.urlsafe_b64encode(hashlib.sha256(b"tally-contact-encryption:" + SECRET_KEY.encode()).digest()).decode()],
)
TALLY_CONTACT_HASH_KEY = env("TALLY_CONTACT_HASH_KEY", default=hashlib.sha256(b"tally-contact-hash:" + SECRET_KEY.encode()).hexdigest())
# Staged data migrations (wallets.staged): services cache a migration's phase this long per
# process; a phase change that writers must see is followed by a wait of TTL + grace.
TALLY_STAGED_PHASE_TTL_SECONDS = env.float("TALLY_STAGED_PHASE_TTL_SECONDS", default=1.0)
TALLY_STAGED_FENCE_GRACE_SECONDS = env.float("TALLY_STAGED_FENCE_GRACE_SECONDS", default=1.0)
# Webhook deliveries (webhooks/services/deliveries.py): requests in flight per endpoint
# across every worker (an endpoint's `max_concurrency` overrides it), requests in flight per
# worker process (the size of its one thread pool for sends, and of each target's kept
# connections), how long a claimed delivery is leased (longer than a
# request's connect and read timeouts: a worker that dies mid-send leaves it due again
# after this), and how long one relay run sends before it hands its worker process to the
# next tenant's relay (it re-queues itself if deliveries are still due).
TALLY_WEBHOOK_ENDPOINT_CONCURRENCY = env.int("TALLY_WEBHOOK_ENDPOINT_CONCURRENCY", default=8)
TALLY_WEBHOOK_PROCESS_CONCURRENCY = env.int("TALLY_WEBHOOK_PROCESS_CONCURRENCY", default=32)
TALLY_WEBHOOK_LEASE_SECONDS = env.float("TALLY_WEBHOOK_LEASE_SECONDS", default=60.0)
TALLY_WEBHOOK_DISPATCH_SECONDS = env.float("TALLY_WEBHOOK_DISPATCH_SECONDS", default=5.0)
