"""CPU time per process over a window, from /proc: where a loaded stack's two cores go.

    .venv/bin/python bench/cpu_by_process.py --seconds 10     # while a load runs

Reads every process's user + system time (/proc/<pid>/stat) at the start and the end of
the window, and prints the difference per command line (PostgreSQL backends summed as
one), with the machine's own totals from /proc/stat. A process born or gone inside the
window is counted for the part it was seen in, or not at all. Run it a few seconds into
a load (e.g. `make run` under wrk), so the window holds only the load.
"""

from __future__ import annotations

import argparse
import collections
import os
import time


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/<pid>/stat after the command name: [0] is the state, [1] the parent, [2] the process group,
    [11] and [12] user and system time in clock ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def cpu_ms(pid: int) -> float:
    """User + system CPU a process has used so far, in ms."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def parent_of(pid: int | str) -> int:
    """A process's parent pid, 0 once it is gone."""
    try:
        return int(_stat_fields(pid)[1])
    except OSError:
        return 0


def processes() -> dict[str, tuple[int, str, int]]:
    """pid -> (user + system time in clock ticks, command line, process group)."""
    seen: dict[str, tuple[int, str, int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = _stat_fields(pid)
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if not command:
                with open(f"/proc/{pid}/comm") as comm:
                    command = f"[{comm.read().strip()}]"
        except OSError:
            continue  # gone meanwhile
        seen[pid] = (int(fields[11]) + int(fields[12]), command, int(fields[2]))  # utime + stime, in ticks
    return seen


def is_postgres(command: str) -> bool:
    """PostgreSQL's postmaster, backends and helper processes (by their command lines)."""
    return command.startswith("postgres") or "/bin/postgres " in command


def postgres_database(command: str) -> str | None:
    """The database a PostgreSQL backend serves, or None for the postmaster and the helper
    processes. Titles: "postgres: [<cluster>: ]<user> <database> <client> <activity>" for a
    backend, "postgres: [<cluster>: ]walwriter" for a helper (Debian sets the cluster name)."""
    words = command.split()
    if not words or words[0] != "postgres:":
        return None
    words = words[2:] if len(words) > 1 and words[1].endswith(":") else words[1:]
    client = words[2] if len(words) > 2 else ""
    return words[1] if client[:1].isdigit() or client.startswith(("[local]", "::")) or "(" in client else None


def machine_spent(before: list[int], after: list[int]) -> list[int]:
    """Ticks per /proc/stat column between two `machine()` readings."""
    return [b - a for a, b in zip(before, after, strict=False)]


def busy_ticks(before: list[int], after: list[int]) -> tuple[int, int]:
    """(busy, idle) ticks of the machine between two `machine()` readings. Busy is user, nice,
    system, irq and softirq: steal is another guest's time, and guest time is already in user."""
    spent = machine_spent(before, after)
    return spent[0] + spent[1] + spent[2] + spent[5] + spent[6], spent[3] + spent[4]


def machine() -> list[int]:
    """/proc/stat's first line: the machine's user, nice, system, idle, iowait, ... ticks."""
    with open("/proc/stat") as stat:
        return [int(x) for x in stat.readline().split()[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    tick = os.sysconf("SC_CLK_TCK")
    before, machine_before = processes(), machine()
    time.sleep(args.seconds)
    after, machine_after = processes(), machine()
    by_command: collections.Counter[str] = collections.Counter()
    for pid, (ticks, command, _group) in after.items():
        key = "postgres (all backends)" if is_postgres(command) else command[:90]
        by_command[key] += ticks - before.get(pid, (0,))[0]
    user, _nice, system, idle, _iowait, _irq, softirq = machine_spent(machine_before, machine_after)[:7]
    print(
        f"machine over {args.seconds:g} s: user {user / tick:.2f} s, system {system / tick:.2f} s, "
        f"softirq {softirq / tick:.2f} s, idle {idle / tick:.2f} s ({os.cpu_count()} cores)"
    )
    for command, ticks in by_command.most_common(args.top):
        if ticks:
            print(f"{ticks / tick:7.2f} s  {command}")


if __name__ == "__main__":
    main()
