"""Issue 13's aims, measured in one run on one machine, each beside its verdict.

    .venv/bin/python bench/bench_aims.py --peers-dir ../shared/peers
    .venv/bin/python bench/bench_aims.py --peers-dir ../shared/peers --stack both --instructions

The issue asks for its aims "in one run on the same machine". Nineteen passes measured
them with five commands by hand, minutes apart, on machines whose speed moved between
runs. This runs those same scripts one after another and prints one table:

1. `bench_http.py --peer --stack web` (`--stack both`: `make run`'s stack as well), 8
   clients, 3 sync workers, `--rounds` rounds: Tally's keyed payments/s over the
   drf-idempotency peer's (aim >= 1.5) and Tally's p99 (aim < 50 ms), every round.
2. `bench_request_cpu.py --gc-freeze --no-layers` alternated `--pairs` times with the
   peer's `bench_peer_request_cpu.py`: Python CPU per keyed payment (aim <= 2 ms),
   the peer's beside it.
3. `bench_ledger.py --processes 16 --threads 1`: the in-process ORM path over the
   raw-SQL ceiling, spread traffic (aim >= 0.35), hot beside it.
4. With `--instructions`, `bench_instructions.py --gc-freeze --peer`: instructions per
   keyed payment, Tally's over the peer's (no aim; the figure the machine's speed does
   not move). About seven minutes more.

An aim is "met" only if every measurement of it met it, and a measurement counts only if
every request it made succeeded (the script stops otherwise: failing requests are cheap).
Each script keeps its own databases, so this touches no test or dev data. The peer's venv
is `$PEER_IDEM_DRFI_VENV` (default /tmp/peer-idem-drfi-venv), as for the scripts it runs.
`--json-out` writes everything the scripts reported, after each step, for BENCHMARKS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_http import PEER_HOW_TO, PEER_VENV  # bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
PEER_PYTHON = str(PEER_VENV / "bin" / "python")

THROUGHPUT_RATIO_MIN = 1.5
P99_MS_MAX = 50.0
PYTHON_CPU_MS_MAX = 2.0
ORM_OVER_RAW_MIN = 0.35


def _script_json(command: list[str]) -> dict[str, Any]:
    """Run one bench script; its result is the last top-level JSON object it printed."""
    started = time.monotonic()
    print(f"$ {' '.join(command)}", file=sys.stderr, flush=True)
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{command[1]} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    start = out.stdout.rfind("\n{\n")
    result: dict[str, Any] = json.JSONDecoder().raw_decode(out.stdout, start + 1 if start >= 0 else 0)[0]
    print(f"  ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return result


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def _all_succeeded(what: str, failures: int) -> None:
    if failures:
        raise SystemExit(f"{what}: requests failed ({failures} counted); its figures would not be a payment's")


def http_rows(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    result = _script_json([
        PYTHON, "bench/bench_http.py", "--peer", "--peers-dir", args.peers_dir, "--stack", args.stack,
        "--seconds", str(args.seconds), "--clients", "8", "--workers", "3", "--rounds", str(args.rounds),
    ])
    loads = [load for r in result["rounds"] for load in [*r["tally"].values(), r["peer_drfi_redis"]]]
    _all_succeeded("bench_http.py", sum(load["non2xx"] + load["errors"] for load in loads))
    peer = [r["peer_drfi_redis"] for r in result["rounds"]]
    rows = []
    for label in result["ratios"]:
        stack = "make run's stack" if "make-run" in label else "gunicorn alone"
        tally = [r["tally"][label] for r in result["rounds"]]
        ratios = result["ratios"][label]
        rows.append([
            f"Tally / peer, keyed payments/s, 8 clients ({stack})",
            ", ".join(f"{r:.2f}" for r in ratios)
            + f" ({', '.join(str(t['ok_per_s']) for t in tally)}/s against {', '.join(str(p['ok_per_s']) for p in peer)}/s);"
            # The machine is CPU-bound at 8 clients: payments/s is about its cores over this.
            + f" machine CPU a payment {', '.join(str(t['cpu_ms_per_request']['machine']) for t in tally)} ms"
            + f" against {', '.join(str(p['cpu_ms_per_request']['machine']) for p in peer)}",
            f">= {THROUGHPUT_RATIO_MIN}", _verdict(all(r >= THROUGHPUT_RATIO_MIN for r in ratios)),
        ])
        p99 = [t["p99_ms"] for t in tally]
        rows.append([
            f"p99 at 8 clients ({stack})",
            ", ".join(f"{p:.1f}" for p in p99) + " ms (the peer " + ", ".join(f"{p['p99_ms']:.1f}" for p in peer) + ")",
            f"< {P99_MS_MAX:.0f} ms", _verdict(all(p < P99_MS_MAX for p in p99)),
        ])
    return rows, result


def python_cpu_rows(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    runs: dict[str, list[dict[str, Any]]] = {"tally": [], "peer": []}
    for _ in range(args.pairs):
        runs["tally"].append(_script_json([
            PYTHON, "bench/bench_request_cpu.py", "--requests", str(args.requests), "--gc-freeze", "--no-layers",
        ]))
        runs["peer"].append(_script_json([
            PEER_PYTHON, "bench/bench_peer_request_cpu.py", "--requests", str(args.requests), "--peers-dir", args.peers_dir,
        ]))
    for side, side_runs in runs.items():
        _all_succeeded(f"in-process ({side})", sum(args.requests - run["statuses"].get("201", 0) for run in side_runs))
    tally = [run["python_cpu_ms_per_request"] for run in runs["tally"]]
    peer = [run["python_cpu_ms_per_request"] for run in runs["peer"]]
    median = statistics.median(t / p for t, p in zip(tally, peer, strict=True))
    return [[
        "Python CPU per keyed payment (in-process, alternated with the peer)",
        ", ".join(f"{t:.3f}" for t in tally) + f" ms (the peer {', '.join(f'{p:.3f}' for p in peer)}; median Tally / peer {median:.2f})",
        f"<= {PYTHON_CPU_MS_MAX:.0f} ms", _verdict(all(t <= PYTHON_CPU_MS_MAX for t in tally)),
    ]], runs


def orm_rows(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    result = _script_json([PYTHON, "bench/bench_ledger.py", "--seconds", str(args.seconds), "--processes", "16", "--threads", "1"])
    _all_succeeded("bench_ledger.py", len(result["errors"]))
    spread = result["tally_spread_over_raw_spread"]
    hot = result["tally_hot_over_raw_hot"] = round(result["tally_hot_tps"] / result["rawsql_hot_tps"], 3)
    return [[
        "ORM path over the raw-SQL ceiling, 16 processes (spread; hot beside it)",
        f"{spread:.3f} ({result['tally_spread_tps']:.1f} / {result['rawsql_spread_tps']:.1f}/s); hot {hot:.3f}",
        f">= {ORM_OVER_RAW_MIN}", _verdict(spread >= ORM_OVER_RAW_MIN),
    ]], result


def instructions_rows(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    result = _script_json([PYTHON, "bench/bench_instructions.py", "--gc-freeze", "--peer", "--peers-dir", args.peers_dir])
    return [[
        "instructions per keyed payment, Tally / peer (callgrind)",
        f"{result['tally_over_peer']} ({result['instructions_per_request']:,} / {result['peer_instructions_per_request']:,})",
        "(no aim)", "",
    ]], result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers-dir", default=str(ROOT.parent / "shared" / "peers"))
    parser.add_argument("--stack", choices=["web", "both"], default="web", help="both: make run's stack as well as gunicorn alone")
    parser.add_argument("--rounds", type=int, default=3, help="Tally-then-peer HTTP rounds")
    parser.add_argument("--seconds", type=int, default=15, help="each HTTP load and each ledger run")
    parser.add_argument("--pairs", type=int, default=3, help="in-process Tally / peer runs, alternated")
    parser.add_argument("--requests", type=int, default=3000, help="per in-process run")
    parser.add_argument("--instructions", action="store_true", help="also count instructions (about seven minutes)")
    parser.add_argument("--json-out", default="", help="write every script's result here")
    args = parser.parse_args()
    # The scripts run from the checkout's root; a relative path means the caller's directory.
    args.peers_dir = str(Path(args.peers_dir).resolve())
    if not Path(PEER_PYTHON).exists():
        raise SystemExit(PEER_HOW_TO.format(peers=args.peers_dir))

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rows: list[list[str]] = []
    raw: dict[str, Any] = {"started": started}
    measures = [("http", http_rows), ("python_cpu", python_cpu_rows), ("orm", orm_rows)]
    if args.instructions:
        measures.append(("instructions", instructions_rows))
    for name, measure in measures:
        measured, raw[name] = measure(args)
        rows.extend(measured)
        raw["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        if args.json_out:  # after each step: a later step's failure keeps what was measured
            Path(args.json_out).write_text(json.dumps(raw, indent=2))

    print(f"Issue 13's aims, {started} to {raw['finished']}\n")
    print("| measure | measured | aim | verdict |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
