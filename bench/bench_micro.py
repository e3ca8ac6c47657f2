"""Two costs measured in isolation, in-process, CPU time per call (issue 13, fourteenth pass).

    .venv/bin/python bench/bench_micro.py prometheus          # and with PROMETHEUS_MULTIPROC_DIR=<empty dir>
    .venv/bin/python bench/bench_micro.py redis-script        # needs Redis at --redis-url

- prometheus: what config.observability's metrics cost a request, the counter's inc and the
  histogram's observe with their labels, as MetricsMiddleware calls them. Run it once with
  and once without PROMETHEUS_MULTIPROC_DIR (an empty directory) to see multiprocess mode's
  share.
- redis-script: one EVALSHA of a small Lua script through redis-py's Script, as the
  throttle and the relay kick send theirs (wallets.fastredis's client settings), against
  the same command written to a socket by hand and its reply read: redis-py's own share.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time


def prometheus(calls: int) -> dict[str, object]:
    from prometheus_client import Counter, Histogram

    requests = Counter("bench_requests_total", "HTTP requests", ["face", "method", "status"])
    seconds = Histogram("bench_request_seconds", "HTTP request latency", ["face"])
    started = time.process_time()
    for _ in range(calls):
        requests.labels(face="terminal", method="POST", status="201").inc()
        seconds.labels(face="terminal").observe(0.004)
    return {"multiprocess_dir": os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "us_per_request": round((time.process_time() - started) / calls * 1e6, 2)}


def _resp(*args: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def redis_script(calls: int, url: str) -> dict[str, object]:
    from urllib.parse import urlsplit

    import redis
    from redis.backoff import NoBackoff
    from redis.commands.core import Script
    from redis.retry import Retry

    client = redis.Redis.from_url(url, socket_connect_timeout=0.25, socket_timeout=0.25, retry=Retry(NoBackoff(), 0))
    script = Script(None, b"return redis.call('INCR', KEYS[1])")  # type: ignore[arg-type]
    script(keys=["bench:micro"], args=[1000, 60000, "abc"], client=client)  # loads it
    started = time.process_time()
    for _ in range(calls):
        script(keys=["bench:micro"], args=[1000, 60000, "abc"], client=client)
    by_redis_py = (time.process_time() - started) / calls
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(_resp(b"SELECT", (parts.path or "/0").lstrip("/") or "0"))
    sock.recv(100)
    sha = script.sha if isinstance(script.sha, bytes) else str(script.sha).encode()
    started = time.process_time()
    for _ in range(calls):
        sock.sendall(_resp(b"EVALSHA", sha, 1, "bench:micro", 1000, 60000, "abc"))
        sock.recv(100)
    by_hand = (time.process_time() - started) / calls
    sock.close()
    return {"redis_py_us_per_call": round(by_redis_py * 1e6, 1), "by_hand_us_per_call": round(by_hand * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["prometheus", "redis-script"])
    parser.add_argument("--calls", type=int, default=0, help="default: 50,000 (prometheus), 20,000 (redis-script)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    args = parser.parse_args()
    if args.what == "prometheus":
        print(json.dumps(prometheus(args.calls or 50_000)))
    else:
        print(json.dumps(redis_script(args.calls or 20_000, args.redis_url)))


if __name__ == "__main__":
    main()
