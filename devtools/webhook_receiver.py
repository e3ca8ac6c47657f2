"""A Tally webhook receiver written with the Python standard library alone.

Copy it, then set TALLY_WEBHOOK_SECRET to your endpoint's signing secret (whsec_...;
during a rotation, both secrets separated by a comma) and run:

    TALLY_WEBHOOK_SECRET=whsec_... python webhook_receiver.py --port 8765

It checks the `Tally-Signature` header (HMAC-SHA256 over "<t>.<body>", any v1= may match,
t within 300 s), answers 400 to anything that fails, and handles each event id once:
Tally delivers at least once, so the same event can arrive again. Events arrive in ANY
order (several at once, each retried on its own), so it keeps each object's latest state
by the event's `sequence` (the object's events numbered in the order they happened; then
`created`), never by arrival. Answer 2xx quickly; do slow work after answering.
`make run` starts this file as the demo merchant's receiver.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE_SECONDS = 300
MAX_BODY_BYTES = 1024 * 1024


class SignatureError(Exception):
    pass


def verify(*, body: bytes, header: str, secrets: list[str], now: float | None = None, tolerance: int = TOLERANCE_SECONDS) -> dict[str, Any]:
    """Return the event if `header` signs `body` under one of `secrets` within `tolerance`
    seconds; raise SignatureError otherwise."""
    timestamp, signatures = None, []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        raise SignatureError("malformed Tally-Signature header")
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        raise SignatureError("timestamp outside the tolerance")
    signed = str(timestamp).encode() + b"." + body
    expected = [hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest() for secret in secrets]
    if not any(hmac.compare_digest(e, s) for e in expected for s in signatures):
        raise SignatureError("no signature matches")
    event: dict[str, Any] = json.loads(body)
    return event


class Dedupe:
    """Event ids handled, and being handled. In memory here; use your database (a unique
    column, written in the same transaction as the event's effect) in production."""

    def __init__(self) -> None:
        self._done: set[str] = set()
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    def begin(self, event_id: str) -> str:
        """'new': handle it, then call `end`. 'done': handled before, answer 2xx. 'busy':
        another delivery of it is being handled (a slow handler outlasted Tally's wait,
        and Tally sent it again): answer 409, and Tally delivers it again later."""
        with self._lock:
            if event_id in self._done:
                return "done"
            if event_id in self._busy:
                return "busy"
            self._busy.add(event_id)
            return "new"

    def end(self, event_id: str, *, handled: bool) -> None:
        with self._lock:
            self._busy.discard(event_id)
            if handled:
                self._done.add(event_id)


class ObjectStore:
    """Each object's latest state, whatever order its events arrive in: an event replaces
    what is kept only if it is later in the object's history (higher `sequence`; events
    from before sequences were kept have 0, and are ordered by `created`). In memory here;
    in production, a row per object updated with `... WHERE sequence < %s`."""

    def __init__(self) -> None:
        self._objects: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def apply(self, event: dict[str, Any]) -> bool:
        """Keep the event's object if it is newer than the one kept; say whether it was."""
        obj = event["data"]["object"]
        rank = (event.get("sequence", 0), event["created"])
        with self._lock:
            kept = self._objects.get(obj["id"])
            if kept is not None and kept[0] >= rank:
                return False  # an older event arriving late: the state kept is newer
            self._objects[obj["id"]] = (rank, obj)
            return True

    def get(self, object_id: str) -> dict[str, Any] | None:
        with self._lock:
            kept = self._objects.get(object_id)
            return kept[1] if kept else None


OBJECTS = ObjectStore()


def handle_event(event: dict[str, Any]) -> None:
    """Your business logic: runs once per event id, in whatever order events arrive."""
    obj = event["data"]["object"]
    latest = OBJECTS.apply(event)
    print(
        f"{event['id']} {event['type']} {obj.get('id', '')} {obj.get('amount', '')} {obj.get('asset', '')}"
        f" sequence={event.get('sequence', 0)}{'' if latest else ' (older than the state kept)'}",
        flush=True,
    )


def make_handler(secrets: list[str], dedupe: Dedupe) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: Tally sends a relay's events on one connection
        disable_nagle_algorithm = True  # headers and body go in two writes: do not hold the body back
        timeout = 30  # seconds a kept connection may sit idle (or a request take to arrive)

        def do_POST(self) -> None:
            # Tally sends one Content-Length of plain digits; anything else is not read, and
            # the connection is closed, so an unread body is never taken for a request.
            lengths = self.headers.get_all("Content-Length") or []
            if "Transfer-Encoding" in self.headers or len(lengths) != 1 or not (lengths[0].isascii() and lengths[0].isdigit()):
                self.close_connection = True
                return self._answer(411, "one Content-Length required")
            length = int(lengths[0])
            if length > MAX_BODY_BYTES:
                self.close_connection = True  # the unread body must not be taken for the next request
                return self._answer(413, "too large")
            body = self.rfile.read(length)
            try:
                event = verify(body=body, header=self.headers.get("Tally-Signature", ""), secrets=secrets)
            except (SignatureError, ValueError) as exc:
                return self._answer(400, str(exc))
            state = dedupe.begin(event["id"])
            if state == "busy":
                return self._answer(409, "being handled")
            if state == "new":
                try:
                    handle_event(event)
                except Exception:  # noqa: BLE001  # whatever the handler raised, answer 5xx: Tally delivers it again
                    dedupe.end(event["id"], handled=False)
                    return self._answer(500, "not handled")
                dedupe.end(event["id"], handled=True)
            return self._answer(200, "ok")

        def _answer(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # quiet: handle_event prints
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="A Tally webhook receiver")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("TALLY_WEBHOOK_RECEIVER_PORT", "8765")))
    args = parser.parse_args()
    secrets = [s for s in os.environ.get("TALLY_WEBHOOK_SECRET", "").split(",") if s]
    if not secrets:
        raise SystemExit("set TALLY_WEBHOOK_SECRET to the endpoint's signing secret")
    server = ThreadingHTTPServer((args.host, args.port), make_handler(secrets, Dedupe()))
    print(f"webhook receiver listening on http://{args.host}:{args.port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
