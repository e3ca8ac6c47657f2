"""Costs measured in isolation, in-process, CPU time per call (issue 13, fourteenth,
eighteenth and twentieth passes).

    .venv/bin/python bench/bench_micro.py prometheus          # and with PROMETHEUS_MULTIPROC_DIR=<empty dir>
    .venv/bin/python bench/bench_micro.py redis-script        # needs Redis at --redis-url
    .venv/bin/python bench/bench_micro.py insert-form         # needs PostgreSQL at --database-url
    .venv/bin/python bench/bench_micro.py collation           # the same

- prometheus: what config.observability's metrics cost a request, the counter's inc and the
  histogram's observe with their labels, as MetricsMiddleware calls them. Run it once with
  and once without PROMETHEUS_MULTIPROC_DIR (an empty directory) to see multiprocess mode's
  share.
- redis-script: one EVALSHA of a small Lua script through redis-py's Script, as the
  throttle and the relay kick send theirs (wallets.fastredis's client settings), against
  the same command written to a socket by hand and its reply read: redis-py's own share.
- insert-form: an INSERT of N ledger-entry-shaped rows (three varchar, a bigint, a
  timestamptz) as psycopg's client-side binding sends it, in the two forms
  wallets.compiled.CompiledInsert can take: one VALUES row of scalars per row, or Django's
  UNNEST of one array per column. For each N (--rows), the client's CPU and the PostgreSQL
  backend's CPU (from /proc) per insert, the forms alternated in blocks; where the VALUES
  form stops being cheaper is what VALUES_ROWS_MAX should be.
- collation: what the database's collation costs a payment's text-keyed indexes. Two
  temporary tables shaped like payments_payment's keys and its four text-led indexes (the
  primary key; merchant, customer and store each with created and id), one with the
  database's default collation on those columns (C.UTF-8 here, which PostgreSQL 15 does
  not treat as C: it compares through strcoll) and one with COLLATE "C" (memcmp), each
  first filled with the same --fill rows of Tally's own ids (wallets.ids), 4,000 customers
  and 200 merchants with a store each; then single-row inserts of new payments among
  those parties, as a payment makes, alternated between the two in blocks, each order
  half the time: the PostgreSQL backend's CPU per insert (from /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from datetime import UTC, datetime


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


def insert_form(calls: int, url: str, rows_list: list[int]) -> dict[str, object]:
    import psycopg
    from cpu_by_process import cpu_ms  # bench/, beside this script

    columns = ("transaction_id", "account_id", "asset_id", "amount", "created")
    types = ("varchar", "varchar", "varchar", "bigint", "timestamptz")
    head = f"INSERT INTO bench_entry ({', '.join(columns)})"
    when = datetime.now(UTC)
    results: dict[str, object] = {}
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute(
            "CREATE TEMP TABLE bench_entry (id bigserial PRIMARY KEY, transaction_id varchar(32) NOT NULL, "
            "account_id varchar(32) NOT NULL, asset_id varchar(16) NOT NULL, amount bigint NOT NULL, created timestamptz NOT NULL)"
        )
        conn.commit()
        backend = conn.info.backend_pid
        for rows in rows_list:
            legs = [("txn_" + "x" * 24, f"acc_{i:024d}", "JPY", (i // 2 + 1) * (1 if i % 2 else -1), when) for i in range(rows)]
            values_sql = head + " VALUES " + ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * rows)
            values_params = [value for leg in legs for value in leg]
            unnest_sql = head + " SELECT * FROM UNNEST(" + ", ".join(f"(%s)::{t}[]" for t in types) + ")"
            unnest_params = [list(column) for column in zip(*legs, strict=True)]
            forms = {"values": (values_sql, values_params), "unnest": (unnest_sql, unnest_params)}
            spent = {form: [0.0, 0.0] for form in forms}
            block = 100
            blocks = max(calls // block // 2, 1)  # per form
            for _ in range(blocks):
                for form, (sql, params) in forms.items():
                    cpu, pg = time.process_time(), cpu_ms(backend)
                    with conn.cursor() as cursor:
                        for _ in range(block):
                            cursor.execute(sql, params)
                    conn.rollback()
                    spent[form][0] += time.process_time() - cpu
                    spent[form][1] += cpu_ms(backend) - pg
            done = blocks * block
            results[str(rows)] = {
                form: {"client_us": round(client / done * 1e6, 1), "postgres_us": round(pg_ms / done * 1e3, 1)}
                for form, (client, pg_ms) in spent.items()
            }
    return results


def collation(calls: int, url: str, fill: int) -> dict[str, object]:
    import random
    import sys
    from datetime import timedelta
    from pathlib import Path

    import psycopg
    from cpu_by_process import cpu_ms  # bench/, beside this script

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from wallets.ids import new_id  # Tally's own ids: same length, alphabet and prefixes

    customers = [new_id("cus") for _ in range(4000)]
    merchants = [new_id("mer") for _ in range(200)]
    stores = [new_id("sto") for _ in merchants]
    party = random.Random(13)

    def payment_row() -> tuple[str, str, str, str]:
        shop = party.randrange(len(merchants))
        return new_id("pay"), party.choice(customers), merchants[shop], stores[shop]

    def create(table: str, column_collation: str) -> str:
        text = f"varchar(32) {column_collation}"
        return (
            f"CREATE TEMP TABLE {table} (id {text} PRIMARY KEY, customer_id {text}, merchant_id {text}, store_id {text}, "
            f"created timestamptz NOT NULL DEFAULT clock_timestamp()); "
            + " ".join(f"CREATE INDEX ON {table} ({column}, created DESC, id DESC);" for column in ("merchant_id", "customer_id", "store_id"))
        )

    tables = {"database default": "bench_coll_default", 'COLLATE "C"': "bench_coll_c"}
    with psycopg.connect(url, autocommit=True) as conn:
        # Both tables and their indexes stay in the backend's local buffers: a page read or
        # written back through the kernel would be in the backend's CPU and drown the compares.
        conn.execute("SET temp_buffers = '1GB'")
        database_collation = conn.execute("SELECT datcollate FROM pg_database WHERE datname = current_database()").fetchone()
        started = datetime.now(UTC) - timedelta(days=30)
        filled = [(*payment_row(), started + timedelta(seconds=13 * i)) for i in range(fill)]
        for table, column_collation in zip(tables.values(), ("", 'COLLATE "C"'), strict=True):
            conn.execute(create(table, column_collation))
            with conn.cursor().copy(f"COPY {table} (id, customer_id, merchant_id, store_id, created) FROM STDIN") as copy:
                for filled_row in filled:
                    copy.write_row(filled_row)
            conn.execute(f"ANALYZE {table}")
        backend = conn.info.backend_pid
        spent = dict.fromkeys(tables, 0.0)
        block = 500
        blocks = max(calls // block // 2, 1)  # per table
        for n in range(blocks):
            # Each order half the time: neither table always follows the other's work.
            for label in list(tables)[:: 1 if n % 2 == 0 else -1]:
                sql = f"INSERT INTO {tables[label]} (id, customer_id, merchant_id, store_id) VALUES (%s, %s, %s, %s)"
                rows = [payment_row() for _ in range(block)]
                pg = cpu_ms(backend)
                with conn.transaction():
                    for row in rows:
                        conn.execute(sql, row, prepare=True)
                spent[label] += cpu_ms(backend) - pg
    done = blocks * block
    return {"database_collation": database_collation[0] if database_collation else None, "fill": fill, "inserts_per_table": done,
            "postgres_us_per_insert": {label: round(ms / done * 1e3, 2) for label, ms in spent.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["prometheus", "redis-script", "insert-form", "collation"])
    parser.add_argument("--calls", type=int, default=0, help=(
        "default: 50,000 (prometheus), 20,000 (redis-script; insert-form: per row count; collation: both tables together)"
    ))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", default="2,6,8,12,20", help="insert-form: the row counts, comma-separated")
    parser.add_argument("--fill", type=int, default=200_000, help="collation: rows in each table before the timed inserts")
    args = parser.parse_args()
    if args.what == "prometheus":
        print(json.dumps(prometheus(args.calls or 50_000)))
    elif args.what == "redis-script":
        print(json.dumps(redis_script(args.calls or 20_000, args.redis_url)))
    elif args.what == "collation":
        print(json.dumps(collation(args.calls or 20_000, args.database_url, args.fill), indent=1))
    else:
        print(json.dumps(insert_form(args.calls or 20_000, args.database_url, [int(n) for n in args.rows.split(",")]), indent=1))


if __name__ == "__main__":
    main()
