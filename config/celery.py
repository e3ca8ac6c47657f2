"""The Celery app. tenant-schemas-celery's CeleryApp sends the current schema with every
task and switches to it in the worker, so a task always runs inside its tenant."""

import os
from typing import Any

from celery.signals import beat_init, celeryd_init, task_postrun, task_prerun
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections
from tenant_schemas_celery.app import CeleryApp

from config.broker import broker_channel_patch

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

# A Redis outage must not end the worker (config/broker.py); the web's and beat's kicks go
# through the same channel class.
broker_channel_patch()
app = CeleryApp("tally")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Database connections live across tasks (docs/WEBHOOKS.md, "Celery configured for money"):
# Celery's Django fixup closes every connection around each task unless CELERY_DB_REUSE_MAX
# is set (celery/celery#4116), and it reads that key under its old name, so it is set here.
app.conf["CELERY_DB_REUSE_MAX"] = 1000


@celeryd_init.connect  # type: ignore[untyped-decorator]  # celery is untyped
@beat_init.connect  # type: ignore[untyped-decorator]  # celery is untyped
def _sealing_ring_refuse(**_: Any) -> None:
    """A worker or beat without a usable sealing ring does not start (gunicorn refuses in
    config/wsgi.py). Celery logs and swallows what a signal handler raises, so the refusal
    leaves as SystemExit, carrying the check's message and its fix."""
    from wallets.checks import sealing_ring_enforce

    try:
        sealing_ring_enforce()
    except ImproperlyConfigured as exc:
        raise SystemExit(f"refusing to start: {exc}") from exc


@task_prerun.connect  # type: ignore[untyped-decorator]  # celery is untyped
@task_postrun.connect  # type: ignore[untyped-decorator]  # celery is untyped
def _database_connections_tidy(task: Any = None, state: str | None = None, **_: Any) -> None:
    """Django's close_old_connections around each task, as around a request. A task that did
    not succeed may leave session state behind (a session advisory lock taken just before a
    soft time limit struck): its connections are closed, which ends it."""
    if task is not None and getattr(task.request, "is_eager", False):
        return  # eager: the caller's connection and transaction, not ours to close
    if state is not None and state != "SUCCESS":
        for conn in connections.all(initialized_only=True):
            conn.close()
        return
    close_old_connections()
