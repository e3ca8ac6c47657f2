"""Schemathesis from outside, as a client's SDK generator sees the API: the CLI against a
live gunicorn, the schema fetched from the tenant's own host, every phase (examples,
coverage, fuzzing, stateful) and every check. Zero failures.

The in-process run (test_schemathesis.py) cannot see what only a real server does: header
whitespace stripped on the wire, gunicorn's own 4xx, the schema as a tenant's host serves it.
Runtime is bounded by TALLY_SCHEMATHESIS_LIVE_EXAMPLES (default 5 per operation and phase).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from payments.services.adjustments import adjustment_create
from tests.api.conftest import World, _world
from tests.conftest import TENANT_A, psp_account_configure
from tests.live import gunicorn_running

EXAMPLES = os.environ.get("TALLY_SCHEMATHESIS_LIVE_EXAMPLES", "5")
ROOT = Path(__file__).resolve().parents[2]

# Positive data may still be refused by rules no schema can express: an id that does not
# exist (404), a payment larger than the wallet or a declined card (402, a business refusal),
# an intent in the wrong state (409). Never 400: the schema states every input rule the
# server enforces (tests/api/test_schema_constraints.py, docs/SCHEMA_CHECK.md).
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "402", "403", "404", "409", "429"]

# Refusals of schema-violating requests include the size limits (docs/schemathesis.toml).
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "414", "415", "422", "428", "429", "431", "5xx"]

# Stateful scenarios follow the schema's links (create -> retrieve/actions): positive data
# only, and enough scenarios that creations succeed and their links are walked.
[phases.stateful]
max-steps = 6

[phases.stateful.generation]
mode = "positive"
max-examples = 30

# The schema's links and Location headers; not dependency analysis (docs/schemathesis.toml
# says why: it links an endpoint into redeliver without a delivery, whose 404 ST302 misreads).
[phases.stateful.inference]
algorithms = ["location-headers"]

[auth.openapi.bearerAuth]
bearer = "${TALLY_ST_KEY}"
"""
FACES = ("customer", "terminal", "merchant", "admin")


@pytest.fixture
def live_world(live_tenant: Any, psp_simulator: Any) -> World:
    psp_account_configure(psp_simulator)  # card top-ups reach a PSP that answers
    world = _world(TENANT_A["domain"], "live")
    adjustment_create(staff=world.staff.obj, customer=world.customer.obj, asset_code="JPY", amount=10**9, direction="credit", reason="fuzz")
    return world


@pytest.fixture
def server(live_tenant: Any) -> Iterator[int]:
    # schemathesis sends hundreds of bad keys on purpose; the failed-authentication limit
    # has its own test (test_edges.py) and would otherwise answer 429 for the rest of the run.
    # Webhook registration refuses a name that does not resolve, and schemathesis's names
    # never do: in this server they resolve to loopback (tests/tools/any_name_resolves).
    pythonpath = os.pathsep.join([str(ROOT / "tests/tools/any_name_resolves"), str(ROOT)])
    with gunicorn_running(workers=2, TALLY_THROTTLE_AUTH_FAILURE_RATE="1000000/min", PYTHONPATH=pythonpath) as port:
        yield port


def _schemathesis(port: int, face: str, key: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """One run per face: a face answers only its own principal's key (SPEC 4)."""
    config = workdir / "schemathesis.toml"
    config.write_text(CONFIG)
    env = dict(os.environ, SCHEMATHESIS_HOOKS="tests.api.schemathesis_live_hooks", TALLY_ST_KEY=key, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "st"), "--config-file", str(config), "--no-color", "run",
            f"http://127.0.0.1:{port}/v1/schema", "--url", f"http://127.0.0.1:{port}",
            "-H", f"Host: {TENANT_A['domain']}", "--include-path-regex", f"^/v1/{face}/",
            "--phases", "examples,coverage,fuzzing,stateful", "--checks", "all",
            "--max-examples", EXAMPLES, "--generation-deterministic", "--workers", "1",
            "--report", "junit", "--report-dir", str(workdir),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )


@pytest.mark.parametrize("face", FACES)
def test_live_api_conforms_to_its_schema(server: int, live_world: World, tmp_path: Path, face: str) -> None:
    key = {"customer": live_world.customer.key, "terminal": live_world.terminal.key,
           "merchant": live_world.merchant.key, "admin": live_world.staff.key}[face]
    result = _schemathesis(server, face, key, tmp_path)
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / f"schemathesis-live-{face}.txt").write_text(result.stdout + result.stderr)
    summary = result.stdout[-6000:]
    assert result.returncode == 0, summary + result.stderr[-3000:]
    assert "Tested: 0" not in summary, summary
