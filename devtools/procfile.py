"""Run the Procfile's processes for `make run` under supervisord (Supervisor, from PyPI), in
this process: a process that exits is started again (after 1 s, 2 s, 3 s, ... when it keeps
failing within `startsecs`), each in its own process group, so a stop reaches what it
forked too; a stop signal stops them all, and one that ignores SIGTERM is killed after the
grace period.

Three things differ from a plain supervisord: SIGHUP (a closed terminal) stops instead of
reloading, a second stop signal a second or more after the first kills every process at
once, and the run exits 128 + the first stop signal's number (130 for Ctrl-C). As with
honcho, `PORT` goes up by 100 per process type (`web` keeps it).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.medusa.asyncore_25 import ExitNow
from supervisor.options import ServerOptions
from supervisor.supervisord import Supervisor

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


def supervisord_conf(entries: Sequence[Entry], *, cwd: Path, state_dir: Path, grace_seconds: float = GRACE_SECONDS,
                     start_seconds: int = START_SECONDS) -> str:
    """supervisord's configuration: one program per entry, run by /bin/sh (a simple command
    is exec'd, so supervisord watches and reports the program itself), stopped as a group."""
    port = os.environ.get("PORT", "")
    sections = [
        "[supervisord]\nnodaemon=true\nlogfile=/dev/null\nlogfile_maxbytes=0\nloglevel=info\n"
        f"pidfile={_ini(str(state_dir / 'supervisord.pid'))}\nidentifier=tally\n",
    ]
    for index, entry in enumerate(entries):
        environment = f'environment=PORT="{int(port) + 100 * index}"\n' if port.isdigit() else ""
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


class _Options(ServerOptions):  # type: ignore[misc]  # supervisor has no type hints
    """supervisord's options, with its stop signals taken here first."""

    supervisord: Any = None
    first_stop: tuple[int, float] | None = None
    kill_now = False

    def setsignals(self) -> None:
        super().setsignals()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop_received)

    def _stop_received(self, sig: int, frame: object) -> None:
        """Each stop signal is passed on to supervisord, SIGHUP as SIGTERM: a shutdown, never a
        reload. One stop delivered twice (`kill` to make's process group, and make passing it
        on) keeps the grace; a second Ctrl-C a second or more later means "now"."""
        now = time.monotonic()
        self.first_stop = self.first_stop or (sig, now)
        self.kill_now = self.kill_now or now - self.first_stop[1] >= SECOND_SIGNAL_SECONDS
        self.signal_receiver.receive(signal.SIGTERM if sig == signal.SIGHUP else sig, frame)

    def get_signal(self) -> int | None:
        """Called once per turn of supervisord's loop."""
        if self.kill_now:
            self.kill_now = False
            self.logger.warn("a second stop signal: killing every process now")
            for group in self.supervisord.process_groups.values():
                for process in group.get_unstopped_processes():
                    process.kill(signal.SIGKILL)
        sig: int | None = super().get_signal()
        return sig


def processes_run(entries: Sequence[Entry], *, cwd: Path, grace_seconds: float = GRACE_SECONDS,
                  start_seconds: int = START_SECONDS) -> int:
    """Run every entry under supervisord, in this process and its environment, until a stop
    signal; returns 128 + that signal's number."""
    with tempfile.TemporaryDirectory(prefix="tally-supervisor-") as state:
        conf = Path(state) / "supervisord.conf"
        conf.write_text(supervisord_conf(entries, cwd=cwd, state_dir=Path(state), grace_seconds=grace_seconds,
                                         start_seconds=start_seconds))
        options = _Options()
        options.realize(["-c", str(conf)])
        options.first, options.test = True, False
        options.supervisord = Supervisor(options)
        sys.stdout.flush()
        try:
            options.supervisord.main()
        except ExitNow:  # every process stopped
            pass
        finally:
            options.close_logger()
    return 128 + options.first_stop[0] if options.first_stop else 0
