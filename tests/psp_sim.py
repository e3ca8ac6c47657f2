"""The real PSP simulator process for tests (devtools/psp_simulator.py), started
on a free port, and a small client for its control endpoints."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.receivers import free_port, process_stop

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Simulator:
    url: str
    process: subprocess.Popen[bytes]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, api_key: str | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def faults(self, **faults: Any) -> dict[str, Any]:
        return dict(self._call("POST", "/_control/faults", faults))

    def faults_clear(self) -> None:
        self.faults(latency_ms=0, charge_latency_ms=0, fail_5xx=0, hang_after_charge=0, hang_seconds=30.0, duplicate_webhooks=False,
                    out_of_order_webhooks=False, webhook_before_response=False, min_charge_amount=0, hang_after_payout=0,
                    fail_after_payout=0, payouts_manual=False, payout_settle_ms=500, payout_arrival_seconds=86400, fail_reversal=0,
                    refuse_reversal=0)

    def flush_webhooks(self) -> int:
        return int(self._call("POST", "/_control/flush_webhooks", {})["flushed"])

    def state(self) -> dict[str, Any]:
        return dict(self._call("GET", "/_control/state"))

    def charges(self, api_key: str, idempotency_key: str | None = None) -> list[dict[str, Any]]:
        query = f"?idempotency_key={idempotency_key}" if idempotency_key else ""
        return list(self._call("GET", f"/v1/charges{query}", api_key=api_key)["data"])

    def payouts(self, api_key: str, reference: str | None = None) -> list[dict[str, Any]]:
        query = f"?reference={reference}" if reference else ""
        return list(self._call("GET", f"/v1/payouts{query}", api_key=api_key)["data"])

    def bank_balance(self, api_key: str, bank_account: str) -> dict[str, int]:
        """What the PSP holds for a bank account: money of payouts failed after they went in transit, not taken back."""
        return {str(k): int(v) for k, v in self._call("GET", f"/v1/bank_accounts/{bank_account}", api_key=api_key)["balance"].items()}

    def settle_payouts(self) -> int:
        return int(self._call("POST", "/_control/settle_payouts", {})["settled"])

    def return_payout(self, payout_id: str) -> bool:
        return bool(self._call("POST", "/_control/return_payout", {"id": payout_id})["returned"])

    def settlement(self, api_key: str, day: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/settlements/{day}", api_key=api_key))

    def webhook_endpoint(self, api_key: str, url: str, secret: str) -> None:
        self._call("POST", "/v1/webhook_endpoints", {"url": url, "secret": secret}, api_key=api_key)

    def webhooks(self) -> list[dict[str, Any]]:
        return list(self.state()["webhooks"])


@contextmanager
def simulator_running() -> Iterator[Simulator]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.psp_simulator", "--port", str(port)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    sim = Simulator(url=f"http://127.0.0.1:{port}", process=process)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(sim.url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the PSP simulator did not start"
                time.sleep(0.05)
        yield sim
    finally:
        process_stop(process, timeout=5)
