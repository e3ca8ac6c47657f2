"""The drf-idempotency peer's keyed POST /pay, called in-process: its cost without HTTP.

    /tmp/peer-idem-drfi-venv/bin/python bench/bench_peer_request_cpu.py --requests 4000

Runs in the PEER's venv (made by `../shared/peers/idem/setup.sh`; see
`../shared/peers/README.md`), with its Redis backend settings (`drfi-redis`), against its
own database (`peer_idem`). It calls the peer's WSGI application directly with a
hand-built environ, a fresh Idempotency-Key and `{"amount": 1}`, as gunicorn's sync worker
would and as `bench/bench_request_cpu.py` calls Tally's. Every request pays from the
peer's one wallet row.

Reports per request: Python CPU (`time.process_time`, this process), wall time, and the
CPU of the request's own PostgreSQL backend (from /proc). Set beside
`bench_request_cpu.py`'s figures and `bench_http.py --peer`'s per-process split, it
separates each system's own work from the cost of serving a request over HTTP (gunicorn's
sync worker and the kernel's per-connection work), which both pay.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cpu_by_process import cpu_ms  # noqa: E402  (stdlib only: runs in the peer's venv too)

BODY = json.dumps({"amount": 1}).encode()


def _environ() -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/pay", "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(BODY)),
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8300", "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1:8300", "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex,
        "wsgi.input": io.BytesIO(BODY), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
        "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.version": (1, 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--peers-dir", default=str(ROOT.parent / "shared" / "peers"))
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/peer_idem")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    args = parser.parse_args()
    if args.requests < 1 or args.warmup < 0:
        parser.error("--requests must be at least 1 and --warmup at least 0")
    idem = Path(args.peers_dir) / "idem"
    if not (idem / "peer_idem" / "wsgi.py").exists():
        sys.exit(f"no peer at {idem}: set it up with ../shared/peers/idem/setup.sh (../shared/peers/README.md)")
    sys.path.insert(0, str(idem))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "peer_idem.settings_drfi_redis")
    os.environ.setdefault("DATABASE_URL", args.database_url)
    os.environ.setdefault("PEER_REDIS_URL", args.redis_url)
    try:
        from peer_idem.wsgi import application
    except ImportError as missing:
        sys.exit(f"{missing}: run this with the peer's venv (/tmp/peer-idem-drfi-venv/bin/python, made by its setup.sh)")
    from django.db import connection

    statuses: dict[str, int] = {}

    def call() -> None:
        started: list[str] = []
        body = application(_environ(), lambda status, headers, exc_info=None: started.append(status))
        b"".join(body)
        getattr(body, "close", lambda: None)()
        statuses[started[0][:3]] = statuses.get(started[0][:3], 0) + 1

    for _ in range(args.warmup):
        call()
    statuses.clear()  # the measured requests only
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

    cpu, wall, pg = time.process_time(), time.perf_counter(), cpu_ms(backend)
    for _ in range(args.requests):
        call()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    n = args.requests
    try:
        pg_per_request: float | None = round((cpu_ms(backend) - pg) / n, 3)
    except FileNotFoundError:
        # The peer closed its connection after CONN_MAX_AGE (60 s), as a run slowed down
        # by valgrind can outlast: its first backend is gone, and so is its count.
        pg_per_request = None
    print(json.dumps({
        "requests": n, "statuses": statuses,
        "python_cpu_ms_per_request": round(cpu * 1000 / n, 3),
        "wall_ms_per_request": round(wall * 1000 / n, 3),
        "postgres_backend_cpu_ms_per_request": pg_per_request,
    }, indent=2))


if __name__ == "__main__":
    main()
