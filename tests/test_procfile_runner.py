"""`make run`'s process runner (config.procfile), run as `make run` runs it: in its own
process, with real child processes, their children, and signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config.procfile import Entry, procfile_read

ROOT = Path(__file__).resolve().parent.parent
LINES = 3000


def _start(tmp_path: Path, procfile: str, *, grace: float = 10.0, port: str = "8000") -> subprocess.Popen[bytes]:
    (tmp_path / "Procfile").write_text(procfile)
    code = (
        "import os, sys; from pathlib import Path; from config.procfile import procfile_read, processes_run; "
        f"sys.exit(processes_run(procfile_read(Path({str(tmp_path)!r}) / 'Procfile'), cwd=Path({str(tmp_path)!r}), "
        f"env=dict(os.environ, PORT={port!r}), grace_seconds={grace}))"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purposes
        return stat.read().split(") ", 1)[1][0] != "Z"


def _wait_for(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_the_procfile_is_read_as_name_and_command(tmp_path: Path) -> None:
    (tmp_path / "Procfile").write_text("# comment\n\nweb: gunicorn app -c x.py\nworker: celery -A config worker --x ${Y:-2}\n")
    assert procfile_read(tmp_path / "Procfile") == [
        Entry("web", "gunicorn app -c x.py"), Entry("worker", "celery -A config worker --x ${Y:-2}"),
    ]
    (tmp_path / "Procfile").write_text("web gunicorn\n")
    with pytest.raises(ValueError, match="name: command"):
        procfile_read(tmp_path / "Procfile")


def test_every_line_arrives_whole_under_its_process_name(tmp_path: Path) -> None:
    """Two processes writing long lines as fast as they can: no line is cut or mixed with
    another, and each carries its own name; PORT goes up by 100 per process, as honcho's."""
    writer = f"import sys; w = sys.stdout; [w.write(sys.argv[1] + ' %05d ' % n + 'x' * 400 + chr(10)) or w.flush() for n in range({LINES})]"
    procfile = (
        f"a: echo port=$PORT; {sys.executable} -c {writer!r} alpha; touch a.done; sleep 60\n"
        f"b: echo port=$PORT; {sys.executable} -c {writer!r} beta; touch b.done; sleep 60\n"
        "c: while [ ! -e a.done ] || [ ! -e b.done ]; do sleep 0.05; done\n"
    )
    runner = _start(tmp_path, procfile)
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 0  # c's own exit code, the first to exit
    lines = out.decode().splitlines()
    line = re.compile(r"^\d\d:\d\d:\d\d (a|b|c|system)(\.1)?\s* \| (.*)$")
    assert all(line.match(text) for text in lines), [text for text in lines if not line.match(text)][:3]
    for name, word in (("a.1", "alpha"), ("b.1", "beta")):
        mine = [text.split(" | ", 1)[1] for text in lines if text[9:].startswith(name + " ")]
        numbered = [text for text in mine if text.startswith(word)]
        assert numbered == [f"{word} {n:05d} " + "x" * 400 for n in range(LINES)]
    assert any(text.endswith("a.1    | port=8000") for text in lines)
    assert any(text.endswith("b.1    | port=8100") for text in lines)


def test_one_process_exiting_stops_the_others_and_what_they_started(tmp_path: Path) -> None:
    procfile = "web: sleep 300 & echo $! > grandchild.pid; wait\nworker: while [ ! -e grandchild.pid ]; do sleep 0.05; done; exit 3\n"
    runner = _start(tmp_path, procfile)
    out, _ = runner.communicate(timeout=30)
    assert runner.returncode == 3, out.decode()
    assert "worker.1 stopped (rc=3)" in out.decode()
    assert not _alive(int(_wait_for(tmp_path / "grandchild.pid")))


def test_sigterm_stops_everything_and_kills_what_ignores_it(tmp_path: Path) -> None:
    procfile = (
        "stubborn: trap '' TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done\n"
        "plain: sleep 300 & echo $! > plain.pid; wait\n"
    )
    runner = _start(tmp_path, procfile, grace=1.0)
    stubborn, plain = int(_wait_for(tmp_path / "stubborn.pid")), int(_wait_for(tmp_path / "plain.pid"))
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=30)
    assert runner.returncode == 128 + signal.SIGTERM, out.decode()
    assert "stubborn.1 did not stop in 1 s: SIGKILL" in out.decode()
    assert not _alive(stubborn) and not _alive(plain)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGQUIT], ids=["ctrl-c", "hangup", "quit"])
def test_a_stop_signal_stops_everything_and_is_the_exit_code(tmp_path: Path, sig: signal.Signals) -> None:
    """The children run in sessions of their own, so a closed terminal's SIGHUP reaches only
    the runner: it must pass the stop on, or they would run on with no one to stop them."""
    runner = _start(tmp_path, "web: sleep 300 & echo $! > web.pid; wait\n")
    web = int(_wait_for(tmp_path / "web.pid"))
    runner.send_signal(sig)
    out, _ = runner.communicate(timeout=30)
    assert runner.returncode == 128 + sig, out.decode()
    assert not _alive(web)


def test_the_grace_outlasts_gunicorns_graceful_timeout() -> None:
    """Requests in flight when `make run` stops finish before anything is killed."""
    from config import gunicorn
    from config.procfile import GRACE_SECONDS

    assert GRACE_SECONDS > gunicorn.graceful_timeout


def test_a_second_ctrl_c_kills_at_once(tmp_path: Path) -> None:
    runner = _start(tmp_path, "stubborn: trap '' TERM INT; echo $$ > stubborn.pid; while :; do sleep 0.1; done\n", grace=60)
    stubborn = int(_wait_for(tmp_path / "stubborn.pid"))
    runner.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert _alive(stubborn)  # ignoring SIGTERM, inside the grace period
    started = time.monotonic()
    runner.send_signal(signal.SIGINT)
    runner.communicate(timeout=30)
    assert time.monotonic() - started < 10 and not _alive(stubborn)


def test_one_stop_delivered_twice_keeps_the_grace(tmp_path: Path) -> None:
    """`kill -TERM` to make run's process group: the runner gets SIGTERM from it and again
    from make, which forwards it. That is one request to stop, not an insistence."""
    runner = _start(tmp_path, "stubborn: trap '' TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done\n", grace=3)
    stubborn = int(_wait_for(tmp_path / "stubborn.pid"))
    runner.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # make's copy comes a moment later, once the stop has begun
    runner.send_signal(signal.SIGTERM)
    time.sleep(1.2)
    assert _alive(stubborn)  # still inside the grace period
    out, _ = runner.communicate(timeout=30)
    assert "stubborn.1 did not stop in 3 s: SIGKILL" in out.decode() and not _alive(stubborn)


def test_one_signal_after_a_process_exited_keeps_the_grace(tmp_path: Path) -> None:
    """A process's exit began the stop; one SIGTERM from outside (docker or systemd stopping
    everything) is not a second request."""
    procfile = (
        "stubborn: trap '' TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done\n"
        "quitter: while [ ! -e stubborn.pid ]; do sleep 0.05; done; exit 3\n"
    )
    runner = _start(tmp_path, procfile, grace=3)
    stubborn = int(_wait_for(tmp_path / "stubborn.pid"))
    time.sleep(0.5)  # the quitter has exited: the stop has begun
    runner.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert _alive(stubborn)
    out, _ = runner.communicate(timeout=30)
    assert "stubborn.1 did not stop in 3 s: SIGKILL" in out.decode() and not _alive(stubborn)

