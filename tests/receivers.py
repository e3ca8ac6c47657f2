"""A real HTTP receiver on 127.0.0.1 for the webhook tests: it records every request and
answers from a script of statuses (then 200), verifying signatures with the receiver
merchants copy from docs/WEBHOOKS.md (devtools/webhook_receiver.py, standard library only).
It can also be slow (`delay`), refuse some events for ever (`refuse`: a poison event),
fail each event's first attempt (`flap`), and it counts the requests it holds at once."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DOC_RECEIVER_PATH = Path(__file__).resolve().parent.parent / "devtools" / "webhook_receiver.py"


def doc_receiver() -> Any:
    """devtools/webhook_receiver.py (the file merchants copy) as a module of its own: each
    call's state (OBJECTS) is its own."""
    spec = importlib.util.spec_from_file_location("tally_doc_webhook_receiver", DOC_RECEIVER_PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int
    script: list[int] = field(default_factory=list)  # statuses to answer first, in order; then 200
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    connections: int = 0  # TCP connections accepted (keep-alive: several requests each)
    closed: int = 0  # of those, how many the client has closed
    delay: float = 0.0  # seconds each request takes to answer
    refuse: set[str] = field(default_factory=set)  # event ids always answered 500
    flap: bool = False  # 500 to the first request of each event, then 200
    in_flight: dict[str, int] = field(default_factory=dict)  # requests held now, per path
    max_in_flight: dict[str, int] = field(default_factory=dict)  # the most held at once, per path
    arrived: dict[str, float] = field(default_factory=dict)  # event id -> first arrival (time.time())

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def event_ids(self, path: str | None = None) -> list[str]:
        with self.lock:
            return [json.loads(r.body)["id"] for r in self.requests if path is None or r.path == path]


def process_stop(process: subprocess.Popen[Any], *, timeout: float, group: bool = False) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout`; to its whole process
    group when `group` (a process started with start_new_session, and what it forked)."""
    def send(sig: signal.Signals) -> None:
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)

    send(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def receiver_running(
    port: int = 0, script: list[int] | None = None, *, delay: float = 0.0, refuse: set[str] | None = None, flap: bool = False
) -> Iterator[Receiver]:
    state = Receiver(port=port, script=list(script or []), delay=delay, refuse=set(refuse or ()), flap=flap)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as devtools/webhook_receiver.py

        def setup(self) -> None:
            super().setup()
            with state.lock:
                state.connections += 1

        def finish(self) -> None:
            super().finish()
            with state.lock:
                state.closed += 1

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                event_id = str(json.loads(body).get("id", ""))
            except ValueError:
                event_id = ""
            with state.lock:
                seen = any(r.body == body and r.path == self.path for r in state.requests)
                state.requests.append(Received(path=self.path, headers=dict(self.headers.items()), body=body))
                state.arrived.setdefault(event_id, time.time())
                status = state.script.pop(0) if state.script else 200
                if event_id in state.refuse or (state.flap and not seen):
                    status = 500
                held = state.in_flight.get(self.path, 0) + 1
                state.in_flight[self.path] = held
                state.max_in_flight[self.path] = max(held, state.max_in_flight.get(self.path, 0))
            if state.delay:
                time.sleep(state.delay)
            with state.lock:
                state.in_flight[self.path] -= 1
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
