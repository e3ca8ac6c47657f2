"""gunicorn settings for `make run` and production: JSON logs, multiprocess metrics."""

import os

from prometheus_client import multiprocess

bind = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
# Measured on 2 cores (bench/bench_http.py): 3 sync workers beat 4 and 6;
# a request is mostly Python CPU, and PostgreSQL needs the rest of the second core.
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
worker_class = "config.gunicorn_workers.EnvelopeSyncWorker"  # gunicorn's own errors in the SPEC 5 envelope
timeout = 30
graceful_timeout = 20
max_requests = 20000
max_requests_jitter = 2000
accesslog = None  # Django logs one JSON line per request (config.observability)
logger_class = "config.gunicorn_workers.NoAccessLogger"
errorlog = "-"
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "pythonjsonlogger.json.JsonFormatter", "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {"gunicorn.error": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
# Once the application is loaded, its objects are frozen out of every later collection.
post_worker_init = "fastpath.gcfreeze.post_worker_init"


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    # A dead worker's live gauges must stop counting in /metrics.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
