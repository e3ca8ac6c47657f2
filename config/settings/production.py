"""Production refuses to start without a secret key, allowed hosts and a database URL."""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import env

for _required in (
    "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "TALLY_CONTACT_ENCRYPTION_KEYS", "TALLY_CONTACT_HASH_KEY", "TALLY_SEALING_KEYS",
):
    if not env(_required, default=""):
        raise ImproperlyConfigured(f"{_required} must be set in production")

SECRET_KEY = env("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS")
DEBUG = False
SESSION_COOKIE_SECURE = env.bool("DJANGO_SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("DJANGO_CSRF_COOKIE_SECURE", default=True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# /metrics only to TALLY_METRICS_TOKEN: the platform's Host header proves nothing here.
TALLY_METRICS_ON_PLATFORM_HOST = env.bool("TALLY_METRICS_ON_PLATFORM_HOST", default=False)
# Static files are collected (`manage.py collectstatic`) at deploy; whitenoise serves STATIC_ROOT.
WHITENOISE_USE_FINDERS = env.bool("TALLY_STATIC_USE_FINDERS", default=False)
