"""The Celery app. tenant-schemas-celery's CeleryApp sends the current schema with every
task and switches to it in the worker, so a task always runs inside its tenant."""

import os

from tenant_schemas_celery.app import CeleryApp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = CeleryApp("tally")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
