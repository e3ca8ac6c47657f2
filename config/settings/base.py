"""Settings shared by every environment. Every value is read through django-environ."""

from __future__ import annotations

from pathlib import Path

import environ

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
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "rest_framework",
    "drf_spectacular",
]
TENANT_APPS = [
    # Each tenant has its own staff users, sessions and admin log.
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "wallets",
    "payments",
    "payments.idempotency",
    "webhooks",
]
INSTALLED_APPS = list(SHARED_APPS) + [a for a in TENANT_APPS if a not in SHARED_APPS]

TENANT_MODEL = "tenants.Tenant"
TENANT_DOMAIN_MODEL = "tenants.Domain"
PUBLIC_SCHEMA_URLCONF = "config.urls_public"
ROOT_URLCONF = "config.urls"
# New tenants are cloned from a migrated template schema: a full migration run per
# tenant takes seconds, a clone well under one (see docs/BENCHMARKS.md).
TENANT_BASE_SCHEMA = "tenant_template"
TENANT_CREATION_FAKES_MIGRATIONS = env.bool("TENANT_CREATION_FAKES_MIGRATIONS", default=True)
SHOW_PUBLIC_IF_NO_TENANT_FOUND = False
# Issue `SET search_path` once per connection and tenant switch instead of before every
# statement. Safe: django-tenants forgets the cached path on set_tenant, rollback,
# savepoint rollback and close, so it is re-issued whenever the database may have lost it.
TENANT_LIMIT_SET_CALLS = env.bool("TENANT_LIMIT_SET_CALLS", default=True)
# Host -> tenant lookups are cached in each process this long (tenants/middleware.py).
TENANT_CACHE_SECONDS = env.float("TENANT_CACHE_SECONDS", default=10.0)

DATABASES = {"default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/tally")}
DATABASES["default"]["ENGINE"] = "django_tenants.postgresql_backend"
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=3))
DATABASE_ROUTERS = ("django_tenants.routers.TenantSyncRouter",)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "config.cache.TallyRedisCache",
        "LOCATION": REDIS_URL,
        # Per-tenant key prefix: tenant A can never read tenant B's cache entries.
        "KEY_FUNCTION": "django_tenants.cache.make_key",
        "REVERSE_KEY_FUNCTION": "django_tenants.cache.reverse_key",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }
}

MIDDLEWARE = [
    "config.observability.RequestIdMiddleware",
    "config.health.HealthMiddleware",
    "config.middleware.FailClosedTenantMiddleware",
    "config.observability.MetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

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
STATIC_ROOT = BASE_DIR / "staticfiles"
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("TALLY_MAX_BODY_BYTES", default=64 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "payments.api.schema.TallyAutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "COERCE_DECIMAL_TO_STRING": True,
    # One error envelope for every face (SPEC 5), DRF's own errors included.
    "EXCEPTION_HANDLER": "payments.api.errors.api_exception_handler",
    # Counted in Redis per API key and per tenant (payments/api/throttling.py); a tenant
    # may override them in Tenant.extra_settings["throttle_rates"].
    "DEFAULT_THROTTLE_RATES": {
        "api_key": env("TALLY_THROTTLE_KEY_RATE", default="6000/min"),
        "tenant": env("TALLY_THROTTLE_TENANT_RATE", default="60000/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tally API",
    "DESCRIPTION": "Multi-tenant wallets and payments. See SPEC.md for the contract.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/v1",
    "SECURITY": [{"bearerAuth": []}],
}

# --- Celery (tenant-schemas-celery carries the schema on every task) ---------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # keep the JSON logging config in workers
# Beat entries (synced into django_celery_beat by the DatabaseScheduler); add yours by key.
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
# Idempotency retention: purge records past replay + tombstone windows, per tenant (issue 4).
CELERY_BEAT_SCHEDULE["idempotency-purge"] = {"task": "idempotency.purge_all_tenants", "schedule": 600.0}

# --- Observability ----------------------------------------------------------------
LOG_LEVEL = env("TALLY_LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "config.observability.LogContextFilter"}},
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(tenant)s",
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
