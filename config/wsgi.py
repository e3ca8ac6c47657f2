import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

application = get_wsgi_application()

# gunicorn runs no system checks: without a usable sealing ring, refuse to start rather
# than fail every PSP call and webhook delivery.
from wallets.checks import sealing_ring_enforce  # noqa: E402

sealing_ring_enforce()
