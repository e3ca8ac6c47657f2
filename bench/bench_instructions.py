"""Instructions per keyed payment in the web process, counted by valgrind (callgrind).

    .venv/bin/python bench/bench_instructions.py
    .venv/bin/python bench/bench_instructions.py --python /path/to/other/venv/bin/python
    .venv/bin/python bench/bench_instructions.py --gc-freeze --peer   # + the drf-idempotency peer's, and the ratio

CPU time per request moves with the machine: on a shared two-core machine the same
code measured 2.5 and 4.2 ms in runs minutes apart (docs/BENCHMARKS.md, issue 13,
eighth pass). An instruction count moves much less: callgrind counts what the process
executes, not how fast the machine ran it. A request also does some work on a clock
(caches' TTLs, the relay kick's mark, CONN_MAX_AGE), which a run slowed by valgrind meets
far more often: counts of the same code moved by up to 9% (tenth pass). The counted runs
therefore hold that clock (`bench_request_cpu.py --steady`, whose docstring lists what it
holds). This runs `bench/bench_request_cpu.py` (the WSGI
application called in-process, as gunicorn's sync worker calls it) under callgrind
twice, with `--short` and `--long` timed requests, and divides the difference by the
difference in requests, so that start-up, seeding and warm-up cancel out. Hash
randomisation is off, so both runs execute the same code the same way.

Instructions are not time: a cache miss costs more than an add. They answer "did this
change make a request do less", not "how many milliseconds". PostgreSQL's and Redis's
own work is not in them (`bench_request_cpu.py` reports the PostgreSQL backend's CPU).
Needs valgrind (Debian package `valgrind`). Takes about a minute per 100 requests.

`--peer` also counts the drf-idempotency peer's keyed POST the same way
(`bench/bench_peer_request_cpu.py` in the peer's venv, `--peer-python`; see
`../shared/peers/README.md`), and prints Tally's count over the peer's: a ratio of work
done, which the machine's speed and drift do not move.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_http import PEER_VENV  # bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent


def instructions(python: str, requests: int, extra: list[str], script: str = "bench/bench_request_cpu.py") -> int:
    """Every instruction the bench process executed with `requests` timed requests."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, PYTHONHASHSEED="0")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, str(ROOT / script), "--requests", str(requests), *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        )
        try:
            statuses = json.loads(run.stdout[run.stdout.index("{"):])["statuses"]
        except (ValueError, KeyError):
            statuses = None
        if run.returncode != 0 or statuses != {"201": requests}:
            raise SystemExit(f"the bench failed under valgrind:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
        found = re.search(r"Collected : (\d+)", run.stderr)
        if found is None:
            raise SystemExit(f"no instruction count in valgrind's output:\n{run.stderr[-2000:]}")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=str(ROOT / ".venv/bin/python"), help="the interpreter (a venv's python)")
    parser.add_argument("--short", type=int, default=100, help="timed requests in the first run")
    parser.add_argument("--long", type=int, default=400, help="timed requests in the second run")
    parser.add_argument("--gc-freeze", action="store_true", help="passed to bench_request_cpu.py: as gunicorn's workers run")
    parser.add_argument("--ab", default="", help="passed to bench_request_cpu.py with --side: count one side of a lever")
    parser.add_argument("--side", default="")
    parser.add_argument("--amount", type=int, default=1, help="passed to bench_request_cpu.py: 450 earns rewards (six ledger entries)")
    parser.add_argument("--permit", choices=["tenant", "mandate"], default="tenant",
                        help="passed to bench_request_cpu.py: what lets the terminal charge by customer id")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_instructions")
    parser.add_argument("--peer", action="store_true", help="also count the drf-idempotency peer's request, and the ratio")
    parser.add_argument("--peer-python", default=str(PEER_VENV / "bin" / "python"))
    parser.add_argument("--peers-dir", default=str(ROOT.parent / "shared" / "peers"), help="with --peer: where ../shared/peers is")
    args = parser.parse_args()
    if bool(args.ab) != bool(args.side):
        parser.error("--ab and --side go together")
    if args.long <= args.short:
        parser.error("--long must be more than --short")
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind: apt-get install valgrind")
    if args.peer and not Path(args.peer_python).exists():
        raise SystemExit(f"no peer venv at {args.peer_python}: set it up with ../shared/peers/idem/setup.sh (../shared/peers/README.md)")
    extra = ["--no-layers", "--steady", "--database-url", args.database_url, "--permit", args.permit, "--amount", str(args.amount)]
    extra += ["--gc-freeze"] if args.gc_freeze else []
    if args.ab:
        extra += ["--ab", args.ab, "--side", args.side]
    # Seed the bench database first, outside valgrind: a first run migrates and seeds it,
    # which the counted runs must not (both find it seeded and only mint fresh keys).
    subprocess.run(
        [args.python, str(ROOT / "bench/bench_request_cpu.py"), "--requests", "1", "--warmup", "1", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, check=True,
    )
    short = instructions(args.python, args.short, extra)
    long = instructions(args.python, args.long, extra)
    per_request = (long - short) / (args.long - args.short)
    peer: dict[str, object] = {}
    if args.peer:
        # The peer's warm-up (300 requests by default) runs in both runs and cancels out.
        peer_extra = ["--peers-dir", args.peers_dir]
        peer_counts = [instructions(args.peer_python, n, peer_extra, script="bench/bench_peer_request_cpu.py") for n in (args.short, args.long)]
        peer_per_request = (peer_counts[1] - peer_counts[0]) / (args.long - args.short)
        peer = {
            "peer_instructions": peer_counts, "peer_instructions_per_request": round(peer_per_request),
            "tally_over_peer": round(per_request / peer_per_request, 2),
        }
    print(json.dumps({
        "python": args.python, "version": subprocess.run([args.python, "--version"], capture_output=True, text=True).stdout.strip(),
        "requests": [args.short, args.long], "instructions": [short, long],
        "instructions_per_request": round(per_request), "gc_freeze": args.gc_freeze, "permit": args.permit, "amount": args.amount,
        **({"lever": args.ab, "side": args.side} if args.ab else {}), **peer,
    }, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
