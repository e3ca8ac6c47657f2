"""The raw-SQL ceiling from ../shared/bench, run with pgbench in the same session.

    python bench/rawsql.py --clients 16 --seconds 15

Re-creates the schema before each pair of runs (as ../shared/bench/README.md asks) and
prints transactions per second for the spread and the hot-merchant scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
# ../shared/bench next to the checkout (or next to the worktrees' folder); TALLY_SHARED_BENCH overrides.
SHARED_BENCH = next(
    (p for p in [Path(os.environ.get("TALLY_SHARED_BENCH", "/nonexistent")), _CHECKOUT.parent / "shared" / "bench",
                 _CHECKOUT.parent.parent / "shared" / "bench"] if (p / "raw_sql_schema.sql").exists()),
    _CHECKOUT.parent / "shared" / "bench",
)
DB = os.environ.get("TALLY_RAWSQL_DB", "tally_rawsql")  # its schema is re-created: give each concurrent user its own


def _pg_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PGHOST", "127.0.0.1")
    env.setdefault("PGUSER", "postgres")
    return env


def _recreate_schema(env: dict[str, str]) -> None:
    subprocess.run(["createdb", DB], env=env, capture_output=True)  # exists already: fine
    subprocess.run(["psql", "-q", DB, "-f", str(SHARED_BENCH / "raw_sql_schema.sql")], env=env, check=True, capture_output=True)


def _pgbench(script: str, clients: int, seconds: int, env: dict[str, str]) -> float:
    out = subprocess.run(
        ["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(seconds), "-f", str(SHARED_BENCH / script), DB],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise RuntimeError(out)
    return float(match.group(1))


def run_ceiling(*, clients: int = 16, seconds: int = 15) -> dict[str, float]:
    env = _pg_env()
    _recreate_schema(env)
    spread = _pgbench("raw_sql_payment.sql", clients, seconds, env)
    _recreate_schema(env)
    hot = _pgbench("raw_sql_payment_hot.sql", clients, seconds, env)
    return {"rawsql_spread_tps": spread, "rawsql_hot_tps": hot, "clients": clients, "seconds": seconds}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=15)
    args = parser.parse_args()
    print(json.dumps(run_ceiling(clients=args.clients, seconds=args.seconds)))
