"""Settings shared by every environment. Every value is read through django-environ; README.md's
table says what each environment variable means, and comments here keep only the why."""

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
    "drf_spectacular_sidecar",  # Swagger UI / Redoc as our own static files: /v1/docs works offline
    "axes",  # admin login throttling; in every schema (platform and tenant logins)
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
# New tenants are cloned from this migrated schema by tenants.schemas, not django-tenants' clone_schema.
TENANT_BASE_SCHEMA = "tenant_template"
TENANT_CREATION_FAKES_MIGRATIONS = env.bool("TENANT_CREATION_FAKES_MIGRATIONS", default=True)
SHOW_PUBLIC_IF_NO_TENANT_FOUND = False
# Safe: django-tenants forgets the cached search_path on set_tenant, (savepoint) rollback and
# close, so it is set again whenever the database may have lost it (docs/SCALING.md).
TENANT_LIMIT_SET_CALLS = env.bool("TENANT_LIMIT_SET_CALLS", default=True)
TENANT_CACHE_SECONDS = env.float("TENANT_CACHE_SECONDS", default=10.0)
TALLY_API_KEY_CACHE_SECONDS = env.float("TALLY_API_KEY_CACHE_SECONDS", default=30.0)
# The server's pg_dump and pg_restore, for `manage.py tenant_restore` (tenants/restore.py): the
# same major version as the server, which the Debian wrappers on PATH may not pick.
TALLY_PG_BIN_DIR = env("TALLY_PG_BIN_DIR", default="/usr/lib/postgresql/15/bin")

DATABASES = {"default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/tally")}
DATABASES["default"]["ENGINE"] = "fastpath.backend"  # django-tenants', with prepared statements (fastpath.prepared)
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Failover (several hosts in DATABASE_URL) and keepalives: docs/RELIABILITY.md. No statement_timeout:
# cancelling a COMMIT that waits for the synchronous standby reports it committed, on the primary alone.
_db_options = DATABASES["default"].setdefault("OPTIONS", {})
for _option, _default in {"connect_timeout": 3, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3, "keepalives_count": 3}.items():
    _db_options.setdefault(_option, env.int(f"DATABASE_{_option.upper()}", default=_default))
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
# Failures are counted per (username, address) in the schema of the host (tenant or platform).
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
STATIC_ROOT = env.path("TALLY_STATIC_ROOT", default=BASE_DIR / "var" / "static")
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
    "EXCEPTION_HANDLER": "apikit.errors.api_exception_handler",  # one error envelope (SPEC 5), DRF's own errors too
    # apikit/throttling.py; a tenant may override them in Tenant.extra_settings["throttle_rates"].
    "DEFAULT_THROTTLE_RATES": {
        "api_key": env("TALLY_THROTTLE_KEY_RATE", default="6000/min"),
        "tenant": env("TALLY_THROTTLE_TENANT_RATE", default="60000/min"),
        "auth_failure": env("TALLY_THROTTLE_AUTH_FAILURE_RATE", default="60/min"),
    },
    # Unset, X-Forwarded-For is ignored (a client could write any address into it).
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
    "SWAGGER_UI_DIST": "SIDECAR",  # drf-spectacular-sidecar's static files, never a CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery (tenant-schemas-celery carries the schema on every task) ---------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# Celery configured for money (every task safe to run twice, none lost): why each, docs/WEBHOOKS.md.
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-task leaves its message to be delivered again
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=120)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=180)
# Redis redelivers an unacknowledged message after this: never schedule a retry by countdown or ETA
# (it would run again and again before it is due); retries are rows with a due time beat reads.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # ride out a broker outage of any length (docs/RELIABILITY.md)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Queues by concern, each consumed and scaled on its own: docs/ARCHITECTURE.md "Beat, due work and
# the Celery queues". "celery" is kept so that messages an older release left there find a consumer.
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
CELERY_TASK_TENANT_CACHE_SECONDS = int(TENANT_CACHE_SECONDS)
# Beat entries (the DatabaseScheduler syncs them); add yours by key. Which tenants each visits: docs/ARCHITECTURE.md.
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
CELERY_BEAT_SCHEDULE["idempotency-purge"] = {"task": "idempotency.purge_all_tenants", "schedule": 600.0}
CELERY_BEAT_SCHEDULE["webhooks-relay"] = {"task": "webhooks.relay_due_tenants", "schedule": 10.0}
# At most an hour: reconciliation reports a card charge not given back within an hour.
TALLY_SAFETY_SWEEP_SECONDS = env.int("TALLY_SAFETY_SWEEP_SECONDS", default=1800)
if not 60 <= TALLY_SAFETY_SWEEP_SECONDS <= 3600:
    raise ImproperlyConfigured("TALLY_SAFETY_SWEEP_SECONDS must be whole seconds from 60 to 3600")
CELERY_BEAT_SCHEDULE["webhooks-relay-sweep"] = {"task": "webhooks.relay_all_tenants", "schedule": TALLY_SAFETY_SWEEP_SECONDS}

# --- Observability ----------------------------------------------------------------
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
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["context"]}},
    "root": {"handlers": ["console"], "level": env("TALLY_LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Tally --------------------------------------------------------------------------
TALLY_PUBLIC_DOMAIN = env("TALLY_PUBLIC_DOMAIN", default="localhost")
TALLY_METRICS_TOKEN = env("TALLY_METRICS_TOKEN", default="")
TALLY_METRICS_ON_PLATFORM_HOST = env.bool("TALLY_METRICS_ON_PLATFORM_HOST", default=True)
DEFAULT_NOT_FOUND_TENANT_VIEW = "config.middleware.tenant_not_found"
TALLY_WEBHOOK_ALLOW_HTTP = env.bool("TALLY_WEBHOOK_ALLOW_HTTP", default=DEBUG)
TALLY_WEBHOOK_ALLOW_LOOPBACK = env.bool("TALLY_WEBHOOK_ALLOW_LOOPBACK", default=False)
TALLY_OUTBOX_RELAY_KICK = env.bool("TALLY_OUTBOX_RELAY_KICK", default=True)
# Test-only: the relay sleeps this long holding a claimed batch (the SIGKILL test). 0 = off.
TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS = env.float("TALLY_RELAY_TEST_PAUSE_AFTER_CLAIM_SECONDS", default=0.0)

# --- Card top-ups and PSPs (payments/services/topup_saga.py) -------------------------
# The lease must outlast the PSP call, so only a crashed or stalled holder's claim is taken over.
TALLY_PSP_TIMEOUT_SECONDS = env.float("TALLY_PSP_TIMEOUT_SECONDS", default=10.0)
TALLY_TOPUP_LEASE_SECONDS = env.int("TALLY_TOPUP_LEASE_SECONDS", default=30)
# A recovery pass's loops (payments/services/topup_budget.py; the payout pass is one of them, payments.tasks), each
# overrunning by one PSP call at most, and the purge and settle after them must end inside the task's own soft
# limit, or the pass dies before its settle.
TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT = env.int("TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT", default=120)
TALLY_TOPUP_RECOVERY_TIME_LIMIT = env.int("TALLY_TOPUP_RECOVERY_TIME_LIMIT", default=180)
if TALLY_TOPUP_RECOVERY_TIME_LIMIT <= TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured("TALLY_TOPUP_RECOVERY_TIME_LIMIT must be above TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT")
CELERY_TASK_ANNOTATIONS = {
    "payments.topups_recover_tenant": {
        "soft_time_limit": TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT, "time_limit": TALLY_TOPUP_RECOVERY_TIME_LIMIT,
    },
}
TOPUP_RECOVERY_LOOPS = 4  # payouts, card refunds, orphaned claims, pending top-ups
TOPUP_RECOVERY_TAIL_SECONDS = 15  # purge, gauges, the due-work settle
_topup_loop_fit = (TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT - TOPUP_RECOVERY_TAIL_SECONDS) / TOPUP_RECOVERY_LOOPS - TALLY_PSP_TIMEOUT_SECONDS
_topup_loop_set = env("TALLY_TOPUP_RECOVERY_LOOP_SECONDS", default="")
if not _topup_loop_set:
    # Too short for a pass: refuse to start rather than round up to a budget that overruns the limit.
    if _topup_loop_fit < 1.0:
        raise ImproperlyConfigured(
            "TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT is too short for a top-up recovery pass: it must be at least"
            f" {TOPUP_RECOVERY_LOOPS} x (1 s + TALLY_PSP_TIMEOUT_SECONDS) + 15 s"
            f" ({TOPUP_RECOVERY_LOOPS * (1 + TALLY_PSP_TIMEOUT_SECONDS) + TOPUP_RECOVERY_TAIL_SECONDS:g} s now)"
        )
    TALLY_TOPUP_RECOVERY_LOOP_SECONDS = _topup_loop_fit
else:
    TALLY_TOPUP_RECOVERY_LOOP_SECONDS = float(_topup_loop_set)
    if not 0 < TALLY_TOPUP_RECOVERY_LOOP_SECONDS <= _topup_loop_fit:
        raise ImproperlyConfigured(
            f"TALLY_TOPUP_RECOVERY_LOOP_SECONDS: {TOPUP_RECOVERY_LOOPS} x (it + TALLY_PSP_TIMEOUT_SECONDS) + 15 s must fit in"
            " TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT"
            f" (at most {_topup_loop_fit:g} s now)"
        )
# One deadline for the whole pass, so loops that each stay in budget cannot add up past the soft limit.
TALLY_TOPUP_RECOVERY_PASS_SECONDS = max(0.0, TALLY_TOPUP_RECOVERY_SOFT_TIME_LIMIT - TOPUP_RECOVERY_TAIL_SECONDS - TALLY_PSP_TIMEOUT_SECONDS)
# Test-only: the saga sleeps this long between the PSP's answer and the completion (the SIGKILL test). 0 = off.
TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS = env.float("TALLY_TOPUP_TEST_PAUSE_AFTER_PSP_SECONDS", default=0.0)
# --- Statements (payments/statements.py) ----------------------------------------------------------
# A posting stamps `created` before it commits, and no statement_timeout bounds its transaction
# (above); what bounds it is the process that holds it: gunicorn kills a request after 30 s
# (config/gunicorn.py), Celery a task after its hard time limit, and PostgreSQL rolls back the dead
# session's transaction. A period is final this long after its end: the longest of those plus a minute.
TALLY_STATEMENT_FINAL_AFTER_SECONDS = env.int(
    "TALLY_STATEMENT_FINAL_AFTER_SECONDS", default=max(30, CELERY_TASK_TIME_LIMIT, TALLY_TOPUP_RECOVERY_TIME_LIMIT) + 60
)
# --- Payouts (payments/services/payout_saga.py, payouts.py) --------------------------------------
# The lease must outlast the PSP call, as a top-up's; the recovery then sends again under the same key.
TALLY_PAYOUT_LEASE_SECONDS = env.int("TALLY_PAYOUT_LEASE_SECONDS", default=30)
# How often the recovery asks the PSP about a payout in transit past the PSP's promise (its webhook may be lost).
TALLY_PAYOUT_CHECK_SECONDS = env.int("TALLY_PAYOUT_CHECK_SECONDS", default=3600)
# Scheduled payouts: beat's period, and how many PSP calls one tenant's run makes at once.
TALLY_PAYOUT_SCHEDULE_SECONDS = env.int("TALLY_PAYOUT_SCHEDULE_SECONDS", default=3600)
TALLY_PAYOUT_SUBMIT_CONCURRENCY = env.int("TALLY_PAYOUT_SUBMIT_CONCURRENCY", default=16)
# Reconciliation reads this many merchants' balances at the PSP a run (one call each), going round them run after run.
TALLY_RECONCILIATION_PAYOUT_DESTINATIONS = env.int("TALLY_RECONCILIATION_PAYOUT_DESTINATIONS", default=200)
# Test-only: the saga sleeps this long between the PSP's answer and the completion (the SIGKILL test). 0 = off.
TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS = env.float("TALLY_PAYOUT_TEST_PAUSE_AFTER_PSP_SECONDS", default=0.0)
CELERY_TASK_ROUTES["payments.payout_submit"] = {"queue": "recovery"}
CELERY_TASK_ROUTES["payments.payout_return"] = {"queue": "recovery"}
CELERY_TASK_ROUTES["payments.payouts_scheduled_tenant"] = {"queue": "recovery"}
CELERY_BEAT_SCHEDULE["payouts-scheduled"] = {"task": "payments.payouts_scheduled_all_tenants", "schedule": float(TALLY_PAYOUT_SCHEDULE_SECONDS)}
CELERY_BEAT_SCHEDULE["topups-recover"] = {"task": "payments.topups_recover_due_tenants", "schedule": 10.0}
CELERY_BEAT_SCHEDULE["topups-recover-sweep"] = {"task": "payments.topups_recover_all_tenants", "schedule": TALLY_SAFETY_SWEEP_SECONDS}

# Sealing keys (wallets/sealing.py), never derived from SECRET_KEY: README.md "Sealing keys".
TALLY_SEALING_KEYS = env.list("TALLY_SEALING_KEYS", default=[])
TALLY_SEALING_LEGACY_SECRET_KEY = env("TALLY_SEALING_LEGACY_SECRET_KEY", default="")

# Contact data encrypted at rest (wallets.contacts); production requires both keys (production.py).
TALLY_CONTACT_ENCRYPTION_KEYS = env.list(
    "TALLY_CONTACT_ENCRYPTION_KEYS",
    default=[base64.urlsafe_b64encode(hashlib.sha256(b"tally-contact-encryption:" + SECRET_KEY.encode()).digest()).decode()],
)
TALLY_CONTACT_HASH_KEY = env("TALLY_CONTACT_HASH_KEY", default=hashlib.sha256(b"tally-contact-hash:" + SECRET_KEY.encode()).hexdigest())
TALLY_STAGED_PHASE_TTL_SECONDS = env.float("TALLY_STAGED_PHASE_TTL_SECONDS", default=1.0)
TALLY_STAGED_FENCE_GRACE_SECONDS = env.float("TALLY_STAGED_FENCE_GRACE_SECONDS", default=1.0)
# Fee schedules: each process caches a merchant's schedules this long (no query on the
# payment path), so a new schedule starts at least this long + the grace after it is added
# (and at least this long after its transaction's end, by the database's clock). Set the same
# value on every process (web, workers): a longer cache elsewhere could apply old terms.
TALLY_FEE_SCHEDULE_CACHE_SECONDS = env.float("TALLY_FEE_SCHEDULE_CACHE_SECONDS", default=10.0)
TALLY_FEE_SCHEDULE_GRACE_SECONDS = env.float("TALLY_FEE_SCHEDULE_GRACE_SECONDS", default=5.0)
# Webhook deliveries: docs/WEBHOOKS.md. The lease must outlast a request's connect and read timeouts.
TALLY_WEBHOOK_ENDPOINT_CONCURRENCY = env.int("TALLY_WEBHOOK_ENDPOINT_CONCURRENCY", default=8)
TALLY_WEBHOOK_PROCESS_CONCURRENCY = env.int("TALLY_WEBHOOK_PROCESS_CONCURRENCY", default=32)
TALLY_WEBHOOK_LEASE_SECONDS = env.float("TALLY_WEBHOOK_LEASE_SECONDS", default=60.0)
TALLY_WEBHOOK_DISPATCH_SECONDS = env.float("TALLY_WEBHOOK_DISPATCH_SECONDS", default=5.0)
