"""Run the Procfile's processes for `make run`: each one's output relayed line by line with
the time and its name, and all of them stopped when one exits, on Ctrl-C, or on SIGTERM,
SIGHUP (a closed terminal: the children, in sessions of their own, would not get it) or
SIGQUIT.

honcho, the usual runner, relays every line through a helper process per child and a
multiprocessing queue (a pickle and two pipe hops a line). Under `make run`'s load that
costs 1.0-1.2 s of CPU every 10 s on the two cores the payments need: about three lines a
payment (the request, the webhook attempt, the receiver's), at 0.13-0.44 ms each
(measured with bench/cpu_by_process.py). Here one thread per process reads its pipe
and writes whole lines under one lock.

Each process starts in its own session, so stopping it reaches what it started too
(gunicorn's and Celery's workers): SIGTERM to every process group, then SIGKILL to those
still there after the grace period. The grace outlasts gunicorn's graceful timeout
(config/gunicorn.py, 20 s), so requests in flight finish; a second signal, a second or
more after the first, kills at once.
As with honcho, `PORT` goes up by 100 per process type from the caller's (the first,
`web`, gets it unchanged), and a run stopped by a signal exits 128 + its number, as a
shell reports it (130 for Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

GRACE_SECONDS = 25.0
SECOND_SIGNAL_SECONDS = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class Entry:
    name: str
    command: str


def procfile_read(path: Path) -> list[Entry]:
    """`name: command` lines; blank lines and `#` comments are skipped."""
    entries = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, command = line.partition(":")
        if not sep or not name.strip() or not command.strip():
            raise ValueError(f"{path}: not a `name: command` line: {line!r}")
        entries.append(Entry(name.strip(), command.strip()))
    return entries


class _Output:
    """Whole lines, one writer at a time; a closed output (`make run | head`) stops the run."""

    def __init__(self, stream: IO[bytes], width: int) -> None:
        self.stream, self.width = stream, width
        self.lock = threading.Lock()
        self.broken = threading.Event()

    def line(self, name: str, text: bytes) -> None:
        prefix = f"{time.strftime('%H:%M:%S')} {name:<{self.width}} | ".encode()
        if not text.endswith(b"\n"):
            text += b"\n"
        with self.lock:
            try:
                self.stream.write(prefix + text)
                self.stream.flush()
            except (OSError, ValueError):  # a closed, full or broken output: stop, never block or die
                self.broken.set()


def _relay(process: subprocess.Popen[bytes], name: str, out: _Output) -> None:
    assert process.stdout is not None
    for text in iter(process.stdout.readline, b""):
        out.line(name, text)


def processes_run(entries: Sequence[Entry], *, cwd: Path, env: dict[str, str], out: IO[bytes] | None = None,
                  grace_seconds: float = GRACE_SECONDS) -> int:
    """Start every entry, relay their output, and stop them all once one exits or this
    process gets one of STOP_SIGNALS. Returns the exit code of the first one that exited
    by itself, or 128 + the signal's number when a signal stopped the run."""
    names = [f"{entry.name}.1" for entry in entries]
    output = _Output(out if out is not None else sys.stdout.buffer, max([len("system"), *map(len, names)]))
    # A plain flag: a handler that took a lock (Event.set) could deadlock against the main
    # thread interrupted while holding the same lock (in Event.wait).
    stop: list[int] = []
    stop_times: list[float] = []

    def on_signal(signum: int, _: object) -> None:
        stop.append(signum)
        stop_times.append(time.monotonic())

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    relays: list[threading.Thread] = []
    base_port = int(env["PORT"]) if env.get("PORT", "").isdigit() else None
    first_exit: int | None = None
    reported: set[str] = set()
    try:
        for index, (entry, name) in enumerate(zip(entries, names, strict=True)):
            child_env = dict(env)
            if base_port is not None:
                child_env["PORT"] = str(base_port + 100 * index)
            process = subprocess.Popen(
                ["/bin/sh", "-c", entry.command], cwd=cwd, env=child_env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
            running.append((name, process))
            relay = threading.Thread(target=_relay, args=(process, name, output), name=f"relay-{name}", daemon=True)
            relay.start()
            relays.append(relay)
            output.line("system", f"{name} started (pid={process.pid})".encode())
        while first_exit is None and not stop and not output.broken.is_set():
            for name, process in running:
                code = process.poll()
                if code is not None:
                    output.line("system", f"{name} stopped (rc={code})".encode())
                    reported.add(name)
                    first_exit = code
                    break
            else:
                time.sleep(0.2)
    finally:
        _stop_all(running, output, grace_seconds, reported, stop_times)
        for relay in relays:
            relay.join(timeout=2)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if first_exit is not None:
        return first_exit
    return 128 + stop[0] if stop else 0  # 0: the output closed


def _stop_all(
    running: list[tuple[str, subprocess.Popen[bytes]]], output: _Output, grace_seconds: float, reported: set[str], signal_times: list[float]
) -> None:
    """SIGTERM to every process group, then SIGKILL to the groups still there after the grace
    (or at once when asked again: `_asked_again`)."""
    groups = [(name, process.pid) for name, process in running]
    if groups:
        output.line("system", b"sending SIGTERM to all processes")
    for _, group in groups:
        _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and not _asked_again(signal_times) and any(_group_alive(group) for _, group in groups):
        for _, process in running:
            process.poll()  # reap the leaders, so that a finished group reads as gone
        time.sleep(0.05)
    why = "asked again" if _asked_again(signal_times) else f"did not stop in {grace_seconds:g} s"
    for name, group in groups:
        if _group_alive(group):
            output.line("system", f"{name} {why}: SIGKILL".encode())
            _signal_group(group, signal.SIGKILL)
    for name, process in running:
        try:
            code = process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            continue
        if name not in reported:
            output.line("system", f"{name} stopped (rc={code})".encode())


def _asked_again(signal_times: list[float]) -> bool:
    """Whether to kill now: a stop signal came at least SECOND_SIGNAL_SECONDS after an
    earlier one. Closer together they are one request delivered twice (`kill -TERM` to
    `make run`'s process group reaches this process, and make forwards SIGTERM to it too);
    one signal alone, even after a process's exit began the stop, keeps the grace."""
    return len(signal_times) > 1 and signal_times[-1] - signal_times[0] >= SECOND_SIGNAL_SECONDS


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass  # the whole group is gone already
    except PermissionError:
        pass  # its leader's id now names another user's group: ours is gone


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):  # gone, or its id now names another user's group
        return False
    return True
