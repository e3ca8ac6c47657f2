"""Run the Procfile's processes for `make run` under supervisord (Supervisor, from PyPI): a
process that exits is started again (after 1 s, 2 s, 3 s, ... when it keeps failing within
`startsecs`), each in its own process group, so a stop reaches what it forked too.

This module stays in front of supervisord, which takes SIGHUP (a closed terminal) as
"reload": every stop signal becomes one SIGTERM to supervisord, and a second signal a second
or more later kills the processes at once. As with honcho, `PORT` goes up by 100 per process
type (`web` keeps it), and the run exits 128 + the signal's number (130 for Ctrl-C).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

GRACE_SECONDS = 25.0
SECOND_SIGNAL_SECONDS = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# A process that dies sooner than this after a start counts as a failed start (backoff).
START_SECONDS = 5
# Failed starts in a row before supervisor gives up (FATAL): about 80 minutes of backoff.
START_RETRIES = 100


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


def _ini(value: str) -> str:
    """A value for supervisord's configuration, which expands %(name)s itself."""
    return value.replace("%", "%%")


def supervisord_conf(entries: Sequence[Entry], *, cwd: Path, env: dict[str, str], state_dir: Path, grace_seconds: float = GRACE_SECONDS,
                     start_seconds: int = START_SECONDS) -> str:
    """supervisord's configuration: one program per entry, run by /bin/sh (a simple command
    is exec'd, so supervisord watches and reports the program itself), stopped as a group."""
    base_port = int(env["PORT"]) if env.get("PORT", "").isdigit() else None
    sections = [
        "[supervisord]\nnodaemon=true\nlogfile=/dev/null\nlogfile_maxbytes=0\nloglevel=info\n"
        f"pidfile={state_dir / 'supervisord.pid'}\ndirectory={_ini(str(cwd))}\nidentifier=tally\n",
        f"[unix_http_server]\nfile={state_dir / 'supervisor.sock'}\nchmod=0700\n",
        "[rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
        f"[supervisorctl]\nserverurl=unix://{state_dir / 'supervisor.sock'}\n",
    ]
    for index, entry in enumerate(entries):
        environment = ""
        if base_port is not None:
            environment = f'environment=PORT="{base_port + 100 * index}"\n'
        sections.append(
            f"[program:{entry.name}]\n"
            f"command={_ini(shlex.join(['/bin/sh', '-c', _exec_simple(entry.command)]))}\n"
            f"directory={_ini(str(cwd))}\n{environment}"
            f"autostart=true\nautorestart=true\nstartsecs={start_seconds}\nstartretries={START_RETRIES}\n"
            f"stopsignal=TERM\nstopwaitsecs={max(1, round(grace_seconds))}\nstopasgroup=true\nkillasgroup=true\n"
            "redirect_stderr=true\nstdout_logfile=/dev/stdout\nstdout_logfile_maxbytes=0\n"
        )
    return "\n".join(sections)


def _exec_simple(command: str) -> str:
    return command if re.search(r"[;&|\n`]|\$\(", command) else f"exec {command}"


def processes_run(entries: Sequence[Entry], *, cwd: Path, env: dict[str, str], out: IO[bytes] | None = None,
                  grace_seconds: float = GRACE_SECONDS, start_seconds: int = START_SECONDS) -> int:
    """Run every entry under supervisord until this process gets one of STOP_SIGNALS (or
    supervisord ends); returns 128 + the signal's number, or supervisord's exit code."""
    stop: list[int] = []
    stop_times: list[float] = []

    def on_signal(signum: int, _: object) -> None:
        stop.append(signum)
        stop_times.append(time.monotonic())

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    with tempfile.TemporaryDirectory(prefix="tally-supervisor-") as state:  # a short path: the socket's is limited
        conf = Path(state) / "supervisord.conf"
        conf.write_text(supervisord_conf(entries, cwd=cwd, env=env, state_dir=Path(state), grace_seconds=grace_seconds,
                                         start_seconds=start_seconds))
        target = out if out is not None else sys.stdout.buffer
        target.flush()
        supervisord = subprocess.Popen(
            [str(Path(sys.executable).parent / "supervisord"), "-c", str(conf)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=target, stderr=subprocess.STDOUT, start_new_session=True,  # our signals, not the terminal's, reach it
        )
        try:
            asked = 0
            while supervisord.poll() is None:
                if len(stop) > asked:
                    if asked == 0:
                        supervisord.send_signal(signal.SIGTERM)
                    elif stop_times[-1] - stop_times[0] >= SECOND_SIGNAL_SECONDS:
                        _kill_children_of(supervisord.pid)
                    asked = len(stop)
                time.sleep(0.1)
        finally:
            if supervisord.poll() is None:
                supervisord.send_signal(signal.SIGTERM)
                try:
                    supervisord.wait(timeout=grace_seconds + 5)
                except subprocess.TimeoutExpired:
                    _kill_children_of(supervisord.pid)
                    supervisord.kill()
                    supervisord.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return 128 + stop[0] if stop else supervisord.returncode


def _kill_children_of(parent: int) -> None:
    """SIGKILL to the process group of each process supervisord started (its children in /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent_pid = int(stat.read().rsplit(") ", 1)[1].split()[1])
            if parent_pid == parent:
                os.killpg(int(entry), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
