"""How long a durable COMMIT takes on this machine: the floor under one wallet row.

    .venv/bin/python bench/bench_commit.py --commits 300

Inserts one row and commits, `--commits` times, on one connection (psycopg, autocommit
off, the server's own `synchronous_commit`), and prints the statement's and the COMMIT's
median and p90 in milliseconds. A payment holds its wallet's row lock until COMMIT
returns, so 1 / (COMMIT median) bounds payments per second on one wallet row, whatever
runs in front of it (docs/BENCHMARKS.md, issue 13). Uses a scratch table in the
`postgres` database and drops it.
"""

from __future__ import annotations

import argparse
import json
import time

import psycopg


def _ms(samples: list[float], quantile: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * quantile))] * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    statement: list[float] = []
    commit: list[float] = []
    with psycopg.connect(args.database_url, autocommit=False) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS tally_bench_commit (x int)")
        conn.commit()
        try:
            for _ in range(args.commits):
                started = time.perf_counter()
                conn.execute("INSERT INTO tally_bench_commit VALUES (1)")
                inserted = time.perf_counter()
                conn.commit()
                statement.append(inserted - started)
                commit.append(time.perf_counter() - inserted)
            setting = conn.execute("SHOW synchronous_commit").fetchone()
        finally:
            conn.execute("DROP TABLE tally_bench_commit")
            conn.commit()
    median = _ms(commit, 0.5)
    print(json.dumps({
        "commits": args.commits, "synchronous_commit": setting[0] if setting else None,
        "insert_ms_p50": _ms(statement, 0.5), "commit_ms_p50": median, "commit_ms_p90": _ms(commit, 0.9),
        "one_row_bound_per_s": round(1000 / median) if median else None,
    }, indent=2))


if __name__ == "__main__":
    main()
