import os
from urllib.parse import urlsplit, urlunsplit

from .base import *  # noqa: F403
from .base import CACHES, CELERY_BROKER_URL, DATABASES, REDIS_URL, REST_FRAMEWORK, env

DEBUG = False
# A fixed database name keeps runs comparable; pytest-django prefixes it with test_.
DATABASES["default"]["NAME"] = env("TALLY_TEST_DB_NAME", default="tally")
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)  # a worker test sets it
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
# Tests change tenant settings inside rolled-back transactions; a cached tenant would
# outlive the rollback. The cache itself is tested with an explicit override.
TENANT_CACHE_SECONDS = 0.0
CELERY_TASK_TENANT_CACHE_SECONDS = 0
# The suite sends many bad keys from one address (the route x principal matrix); the
# failed-authentication limit itself is tested with its own rate.
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "auth_failure": "1000000/min"}}
# No collected STATIC_ROOT unless a test sets one (the live gunicorn test collects into a tmp dir).
STATIC_ROOT = env("TALLY_STATIC_ROOT", default="") or None

# A fixed sealing ring (wallets/sealing.py); tests of rotation change it.
TALLY_SEALING_KEYS = env.list("TALLY_SEALING_KEYS", default=["test1:dGFsbHktdGVzdC1zZWFsaW5nLWtleS0wMDAwMDAwMDE="])
# The servers and workers the tests start (local settings) open what the tests sealed.
os.environ.setdefault("TALLY_SEALING_KEYS", ",".join(TALLY_SEALING_KEYS))

# Staged migrations wait TTL + grace after a phase change; short in tests.
TALLY_STAGED_PHASE_TTL_SECONDS = env.float("TALLY_STAGED_PHASE_TTL_SECONDS", default=0.2)
TALLY_STAGED_FENCE_GRACE_SECONDS = env.float("TALLY_STAGED_FENCE_GRACE_SECONDS", default=0.3)

# Each pytest-xdist worker has its own test database but the same tenant schema names, so
# Redis keys derived from a schema (throttles, kick marks, key epochs) need a database per worker:
# worker gw<n> uses database `db + 1 + n` (mod 16).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _shared = REDIS_URL
    _parts = urlsplit(REDIS_URL)
    REDIS_URL = urlunsplit(_parts._replace(path=f"/{(int(_parts.path.strip('/') or 0) + 1 + int(_WORKER[2:])) % 16}"))
    CACHES["default"]["LOCATION"] = REDIS_URL
    if CELERY_BROKER_URL == _shared:
        CELERY_BROKER_URL = REDIS_URL
