"""Where a request's Python time goes by package, from py-spy's raw samples.

    .venv/bin/py-spy record -r 500 -f raw -o /tmp/spy.txt -- \\
        .venv/bin/python bench/bench_request_cpu.py --requests 6000 --gc-freeze --no-layers
    .venv/bin/python bench/spy_by_package.py /tmp/spy.txt [--own-files]

Each sample is charged to the package of its innermost Python frame (py-spy without
--native charges C calls, builtins and system calls to the Python frame that made them).
Only samples taken inside the bench's request loop count (a frame matching --within), so
the app's loading and the migrations are left out. The share of our own packages bounds
what compiling our own code (mypyc, Cython) could save: all of it if our frames cost
nothing, which no compiler gives.
"""

from __future__ import annotations

import argparse
import collections
import re

OWN_PACKAGES = ("config", "payments", "wallets", "tenants", "webhooks")
_FRAME_FILE = re.compile(r"\((.*?):\d+\)$")


def _file_of(frame: str) -> str:
    match = _FRAME_FILE.search(frame)
    return match.group(1) if match else "?"


def package_of(frame: str) -> str:
    """py-spy names a frame `function (path:line)`, the path relative to its sys.path entry."""
    path = _file_of(frame)
    if "/" not in path:
        return f"(stdlib or script) {path}"
    top = path.split("/", 1)[0]
    return f"own: {top}" if top in OWN_PACKAGES else top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", help="py-spy record -f raw output")
    parser.add_argument("--within", default="main.<locals>.one", help="count only stacks holding this frame name")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--leaves", default="", metavar="TEXT", help="also list the innermost frames containing TEXT")
    parser.add_argument("--own-files", action="store_true", help="also list our own packages' files, as shares of their samples")
    args = parser.parse_args()

    by_package: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    own_files: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.samples) as samples:
        for line in samples:
            stack, _, count = line.rstrip().rpartition(" ")
            if args.within not in stack:
                continue
            n = int(count)
            total += n
            leaf = stack.rsplit(";", 1)[-1]
            package = package_of(leaf)
            by_package[package] += n
            if args.own_files and package.startswith("own: "):
                own_files[_file_of(leaf)] += n
            if args.leaves and args.leaves in leaf:
                leaves[leaf] += n
    if not total:
        raise SystemExit(f"no sample holds a frame named {args.within!r}")
    for package, n in by_package.most_common(args.top):
        print(f"{package:45s} {n:8d} {100 * n / total:5.1f}%")
    own = sum(n for package, n in by_package.items() if package.startswith("own: "))
    print(f"{'own packages together':45s} {own:8d} {100 * own / total:5.1f}%  (of {total} samples)")
    for leaf, n in leaves.most_common(args.top):
        print(f"{n:8d} {100 * n / total:5.1f}%  {leaf}")
    for path, n in own_files.most_common(args.top):
        print(f"{path:45s} {n:8d} {100 * n / own:5.1f}% of our own")


if __name__ == "__main__":
    main()
