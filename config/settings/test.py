from .base import *  # noqa: F403
from .base import DATABASES, REST_FRAMEWORK, env

DEBUG = False
# A fixed database name keeps runs comparable; pytest-django prefixes it with test_.
DATABASES["default"]["NAME"] = env("TALLY_TEST_DB_NAME", default="tally")
DATABASES["default"]["CONN_MAX_AGE"] = 0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
# Tests change tenant settings inside rolled-back transactions; a cached tenant would
# outlive the rollback. The cache itself is tested with an explicit override.
TENANT_CACHE_SECONDS = 0.0
# The suite sends many bad keys from one address (the route x principal matrix); the
# failed-authentication limit itself is tested with its own rate.
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "auth_failure": "1000000/min"}}
# Whitenoise serves from the apps' static folders (finders); no collected STATIC_ROOT
# unless a test sets one (the live gunicorn test collects into a tmp dir).
STATIC_ROOT = env("TALLY_STATIC_ROOT", default="") or None

# Staged migrations wait TTL + grace after a phase change; short in tests.
TALLY_STAGED_PHASE_TTL_SECONDS = env.float("TALLY_STAGED_PHASE_TTL_SECONDS", default=0.2)
TALLY_STAGED_FENCE_GRACE_SECONDS = env.float("TALLY_STAGED_FENCE_GRACE_SECONDS", default=0.3)
