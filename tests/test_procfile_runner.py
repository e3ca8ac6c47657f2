"""`make run`'s process runner (devtools.procfile: supervisord), run as `make run` runs it:
in its own process, with real child processes, their children, and signals."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.procfile import Entry, procfile_read

ROOT = Path(__file__).resolve().parent.parent


def _start(tmp_path: Path, procfile: str, *, grace: float = 10.0, port: str = "8000", start_seconds: int = 5) -> subprocess.Popen[bytes]:
    (tmp_path / "Procfile").write_text(procfile)
    code = (
        "import sys; from pathlib import Path; from devtools.procfile import procfile_read, processes_run; "
        f"sys.exit(processes_run(procfile_read(Path({str(tmp_path)!r}) / 'Procfile'), cwd=Path({str(tmp_path)!r}), "
        f"grace_seconds={grace}, start_seconds={start_seconds}))"
    )
    env = dict(os.environ, PORT=port)
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


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


def test_a_process_killed_is_started_again_and_the_others_keep_running(tmp_path: Path) -> None:
    """SIGKILL to one process: supervisord logs its exit and starts it again; the other
    process, and what it started, run on untouched. PORT goes up by 100 per process, as
    honcho's."""
    procfile = (
        "web: echo port=$PORT; sleep 300 & echo $! > web.pid; wait\n"
        "worker: echo port=$PORT; echo $$ >> worker.pids; while :; do sleep 0.1; done\n"
    )
    runner = _start(tmp_path, procfile, start_seconds=1)
    web = int(_wait_for(tmp_path / "web.pid"))
    first = int(_wait_for(tmp_path / "worker.pids"))
    time.sleep(1.5)  # past startsecs: an exit now is a crash of a running process, not a failed start
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while len((tmp_path / "worker.pids").read_text().split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    second = int((tmp_path / "worker.pids").read_text().split()[1])
    assert second != first and _alive(second)
    assert _alive(web)  # untouched
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=30)
    text = out.decode()
    assert "exited: worker (terminated by SIGKILL; not expected)" in text, text
    assert text.count("spawned: 'worker'") == 2 and text.count("spawned: 'web'") == 1, text
    assert "port=8000" in text and "port=8100" in text
    assert not _alive(web) and not _alive(second)


def test_a_process_that_keeps_failing_to_start_is_tried_again_after_a_delay(tmp_path: Path) -> None:
    runner = _start(tmp_path, "broken: date +%s.%N >> starts; exit 1\nweb: sleep 300 & echo $! > web.pid; wait\n", start_seconds=1)
    web = int(_wait_for(tmp_path / "web.pid"))
    deadline = time.monotonic() + 30
    while len(_wait_for(tmp_path / "starts").split()) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    starts = [float(t) for t in (tmp_path / "starts").read_text().split()][:4]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    # Supervisor's backoff: a second more after each failed start (on its one-second tick),
    # never a tight loop of restarts.
    assert min(gaps) > 0.9 and sum(gaps) > 4, gaps
    assert _alive(web)
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=30)
    assert "exited: broken (exit status 1; not expected)" in out.decode()


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
    assert "killing 'stubborn'" in out.decode() and "with SIGKILL" in out.decode()
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
    from devtools.procfile import GRACE_SECONDS

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
    assert "with SIGKILL" in out.decode() and not _alive(stubborn)
