"""Keyed terminal payments over loopback HTTP against gunicorn, vs the raw-SQL ceiling.

    .venv/bin/python bench/bench_http.py --seconds 15 --clients 16 --workers 4

Seeds its own database (default tally_bench_http) with a tenant, customers with funds,
200 merchants with one terminal each (spread traffic) and one hot merchant with 16
terminals (hot traffic), mints fresh terminal keys, starts gunicorn with the production
settings and config/gunicorn.py (the worker count given), then drives
`POST /v1/terminal/payments` with a fresh Idempotency-Key each from --clients concurrent
clients (processes x threads, new connection per request, like sync gunicorn wants).
Reports payments/s, p50 and p99 for spread and hot traffic, then runs the raw-SQL
ceiling (bench/rawsql.py, pgbench) with the same client count and duration, and the
ratios. gunicorn is stopped at the end, whatever happens.

    .venv/bin/python bench/bench_http.py --peer --seconds 15 --clients 16 --workers 3 --rounds 2

runs Tally and the drf-idempotency peer (Redis backend, `../shared/peers/idem`) back to
back, `--rounds` times, with the same wrk script (`../shared/peers/http/keyed_post.lua`, a
fresh Idempotency-Key per request), clients, duration and gunicorn worker count, and
prints each round's keyed payments/s, p50, p99 and the ratio Tally / peer. Both pay from
one wallet row. If the peer is not set up, it says how. Each measured run also splits the
machine's CPU over its requests (`cpu_ms_per_request`, from /proc): the server's gunicorn
processes, PostgreSQL, Redis, wrk, the rest, and the machine's busy and idle time. Each
round's `tally` and `ratio` are keyed by Tally's worker class: `--worker-class gthread`
(or `both`, each in every round) runs Tally on gunicorn's gthread worker, one thread,
which keeps wrk's connections alive; `sync` (the default) is config/gunicorn.py's own.

    .venv/bin/python bench/bench_http.py --peer --stack both --seconds 15 --clients 8 --workers 3

`--stack make-run` runs Tally as `make run` does instead of gunicorn alone: its runner
(devtools.procfile) with the Procfile's web, Celery worker, Celery beat and webhook receiver,
the local settings with DJANGO_DEBUG=false and the request log at INFO, Prometheus'
multiprocess directory set, and the hot merchant's webhook endpoint at that receiver, so
each payment's event is relayed and delivered while the load runs (with gunicorn alone they
pile up unpublished). The processes' output goes to /dev/null, not a terminal, and the
tenant is the bench's (charging by customer id on its setting; `make run`'s demo tenant
asks for a mandate). It waits for the relay to drain what earlier runs left before
measuring, and splits the CPU per process group (`runner`, `web`, `worker`, `beat`,
`receiver`; `other_make_run` for one it cannot name), with `worker_consumer` the part of
`worker` that Celery's consumer process took (the pool's processes run the tasks). Events the relay has not reached when
the load stops are counted in `events_backlog_after`; their relaying falls outside the
split. `--stack both` runs each, per round; their figures are keyed `sync+make-run` and
`sync`.

    .venv/bin/python bench/bench_http.py --fees --seconds 10 --clients 16 --workers 3 --rounds 8

measures what a fee costs: half the spread merchants have a fee schedule of their own
(2.5 %), half none; one gunicorn serves spread traffic to each half in turn, in blocks of
--seconds, --rounds times (the order swapped each round), and it prints each block's
payments/s and the server's CPU a payment (gunicorn and its PostgreSQL backends, from /proc),
each round's ratio with / without a fee and their median.

    .venv/bin/python bench/bench_http.py --daily-totals --seconds 10 --clients 16 --workers 3 --rounds 6

measures, the same way, what the customer and system accounts' daily totals cost a payment:
blocks with the staged migration `account_daily_totals` expanded (written) and absent (not).

    .venv/bin/python bench/bench_http.py --webhook-cost --seconds 15 --clients 8 --workers 3 --rounds 2

measures what delivering each payment's event costs, as a user sees it: `make run`'s stack
(as `--stack make-run`), keyed payments from wrk (the peers' script, one wallet row, as
`--peer`), in blocks with the hot merchant's endpoint subscribed to every event and
subscribed to none (no delivery is made), alternating, --rounds times (the order swapped
each round). Each block waits for the relay to drain, then prints its payments/s, p99, the
CPU per process group, the deliveries that succeeded for its events, the worker's CPU per
delivered event (the worker's CPU over the block, and over and above the block without),
and the delivery lag from each event's `created` to its successful attempt's start, p50 and
p99. Then each round's with / without ratio of payments/s and their median.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_by_process import parent_of
from bench.harness import (
    DOMAIN,
    ROOT,
    SCHEMA,
    WORKER_ARGS,
    bench_env,
    drive,
    drive_wrk,
    gunicorn_start,
    port_free,
    runner_start,
    seed,
    stop,
    wait_ready,
)

# --- Side by side with the drf-idempotency peer (../shared/peers), same wrk script ------------

PEER_VENV = Path(os.environ.get("PEER_IDEM_DRFI_VENV", "/tmp/peer-idem-drfi-venv"))
PEER_HOW_TO = """the drf-idempotency peer is not set up here. Once:
    {peers}/idem/setup.sh        # venvs under /tmp, database peer_idem, the wallet
(see {peers}/README.md), then run this again."""


def _peers_dir(given: str | None) -> Path:
    candidates = [Path(given)] if given else [ROOT.parent / "shared" / "peers", ROOT.parent.parent / "shared" / "peers"]
    for candidate in candidates:
        if (candidate / "http" / "keyed_post.lua").exists():
            return candidate
    raise SystemExit(f"no peers directory with http/keyed_post.lua among {[str(c) for c in candidates]}; pass --peers-dir")


def cpu_per_request(
    server: int | dict[int, str], database: str, run: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run `run()` (a wrk run returning its JSON line) and split the machine's CPU over its
    successful requests, in ms per request: the server's gunicorn (its process group, or
    each labelled process group of `server`: {pgid: label}), PostgreSQL (the backends of
    `database`, the postmaster and the helper processes), Redis, wrk (this process's reaped
    children), the machine's busy and idle time, and `other`: busy time none of these
    account for (anything else running shows up there). A process that exits inside the
    run counts only if it was reaped by one counted (bench/cpu_by_process.py reads /proc)."""
    import resource

    from bench.cpu_by_process import busy_ticks, is_postgres, machine, postgres_database, processes

    before, machine_before = processes(), machine()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run()
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    after, machine_after = processes(), machine()
    ok = result["requests"] - result["non2xx"]
    if ok <= 0:
        raise RuntimeError(f"no successful request to divide the CPU over: {result}")
    groups = server if isinstance(server, dict) else {server: "web"}
    ticks = dict.fromkeys(["web", *groups.values(), "postgres", "redis"], 0)
    consumer = 0  # of the worker's ticks, its consumer process's (the pool's parent)
    for pid, (spent, command, group) in after.items():
        spent -= before.get(pid, (0,))[0]
        if group in groups:
            ticks[groups[group]] += spent
            if groups[group] == "worker" and _is_celery_consumer(pid, command, group, after):
                consumer += spent
        elif is_postgres(command) and postgres_database(command) in (None, database):
            ticks["postgres"] += spent
        elif command.startswith("redis-server"):
            ticks["redis"] += spent
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    busy, idle = busy_ticks(machine_before, machine_after)
    wrk_ms = ((children_after.ru_utime - children_before.ru_utime) + (children_after.ru_stime - children_before.ru_stime)) * 1000
    ms = {group: spent * tick_ms for group, spent in ticks.items()}
    ms["wrk"] = wrk_ms
    ms["other"] = busy * tick_ms - sum(ms.values())
    if "worker" in groups.values():  # a part of "worker", not counted again in "other"
        ms["worker_consumer"] = consumer * tick_ms
    # Idle time says whether the run was bound by the two cores or by something else.
    ms["machine"], ms["idle"] = busy * tick_ms, idle * tick_ms
    return result, {group: round(value / ok, 2) for group, value in ms.items()}


def wrk_keyed(url: str, *, lua: Path, body: str, clients: int, seconds: int, auth: str | None = None, host: str | None = None) -> dict[str, Any]:
    """The peers' wrk script (a fresh Idempotency-Key per request); its `JSON {...}` line."""
    import shutil

    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk (Debian package: apt-get install -y wrk)")
    env = dict(os.environ, BODY=body)
    env.pop("AUTH", None)
    env.pop("HOST", None)
    if auth:
        env["AUTH"] = auth
    if host:
        env["HOST"] = host
    threads = max(1, min(4, clients))
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{clients}", f"-d{seconds}s", "-s", str(lua), url], env=env, capture_output=True, text=True, check=True
    ).stdout
    line = next((x for x in out.splitlines() if x.startswith("JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no JSON line:\n{out}")
    result: dict[str, Any] = json.loads(line[len("JSON "):])
    result["ok_per_s"] = round((result["requests"] - result["non2xx"]) / result["seconds"], 1)
    return result


# `--stack make-run`: the Procfile's processes a payment's event passes through, under
# `make run`'s own runner (devtools.procfile), as `make run` starts them. The PSP simulator is
# left out: no payment calls it.
MAKE_RUN_ENTRIES = ("web", "worker", "beat", "receiver")


def _hot_endpoint_ensure(url: str) -> str:
    """The hot merchant's webhook endpoint (every event) at `url`, enabled, and its secret;
    its endpoints elsewhere (an earlier run's receiver port) disabled, so nothing waits on a
    receiver that is not there."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from wallets.models import Merchant
    from webhooks.models import WebhookEndpoint, WebhookEndpointStatus
    from webhooks.secrets import webhook_endpoint_secrets
    from webhooks.services.endpoints import webhook_endpoint_create

    with schema_context(SCHEMA):
        hot = Merchant.objects.get(name="Hot merchant")
        endpoint = WebhookEndpoint.objects.filter(merchant=hot, url=url).first()
        if endpoint is None:
            endpoint, _ = webhook_endpoint_create(merchant=hot, url=url, enabled_events=["*"], description="bench_http --stack make-run")
        WebhookEndpoint.objects.filter(merchant=hot).exclude(pk=endpoint.pk).update(status=WebhookEndpointStatus.DISABLED)
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(status=WebhookEndpointStatus.ENABLED, disabled_reason="")
        secret = webhook_endpoint_secrets(endpoint=endpoint).current
    connection.set_schema_to_public()
    return secret


def _events_backlog() -> tuple[int, int]:
    """The bench tenant's events not yet published, and deliveries still pending."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import OutboxEvent
    from webhooks.models import WebhookDelivery, WebhookDeliveryStatus, WebhookEndpointStatus

    with schema_context(SCHEMA):
        # Every pending delivery of an enabled endpoint, due or not: one waiting out a retry
        # holds back its endpoint's later ones, which would then be sent inside the run.
        backlog = (
            OutboxEvent.objects.filter(published_at__isnull=True, dead_at__isnull=True).count(),
            WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.PENDING, endpoint__status=WebhookEndpointStatus.ENABLED).count(),
        )
    connection.set_schema_to_public()
    return backlog


def _events_drained(timeout: float) -> float:
    """Wait until the relay has published and delivered everything (events the `web` stack
    left behind, a warm-up's): seconds waited. A stack measured on a backlog would be
    measuring the backlog."""
    started = time.monotonic()
    while any(_events_backlog()):
        if time.monotonic() - started > timeout:
            raise SystemExit(f"the relay did not drain the bench tenant's events in {timeout:.0f} s: {_events_backlog()} left"
                             " (events, deliveries); a fresh --database-url starts with none")
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


class _MakeRunStack:
    """`make run`'s web, worker, beat and receiver under its runner, as `make run` starts them:
    the local settings with DJANGO_DEBUG=false, the request log at INFO, Prometheus'
    multiprocess directory set, the hot merchant's events going to that receiver.
    `groups` labels each process group for the CPU split."""

    def __init__(self, env: dict[str, str], *, port: int, receiver_port: int, workers: int, worker_class: str) -> None:
        import shutil
        import tempfile

        busy = [p for p in (port, receiver_port) if not port_free(p)]
        if busy:
            raise SystemExit(f"port(s) {busy} in use: is `make run` or an earlier bench still running?")
        secret = _hot_endpoint_ensure(f"http://127.0.0.1:{receiver_port}/webhooks")
        self.prometheus_dir = tempfile.mkdtemp(prefix="tally-bench-prometheus-")
        env = dict(
            env, DJANGO_SETTINGS_MODULE="config.settings.local", DJANGO_DEBUG="false", TALLY_LOG_LEVEL="INFO",
            PORT=str(port), WEB_CONCURRENCY=str(workers), VENV_BIN=str(ROOT / ".venv/bin"),
            TALLY_WEBHOOK_RECEIVER_PORT=str(receiver_port), TALLY_WEBHOOK_SECRET=secret, PROMETHEUS_MULTIPROC_DIR=self.prometheus_dir,
        )
        if WORKER_ARGS[worker_class]:
            env["GUNICORN_CMD_ARGS"] = " ".join(WORKER_ARGS[worker_class])
        try:
            self.runner = runner_start(env, MAKE_RUN_ENTRIES)
        except BaseException:
            shutil.rmtree(self.prometheus_dir, ignore_errors=True)
            raise
        self.groups: dict[int, str] = {self.runner.pid: "runner"}
        try:
            wait_ready(port, process=self.runner)
            from bench.cpu_by_process import processes

            # The runner is supervisord: each Procfile process is its child and its own
            # process group's leader, its children (gunicorn's workers, Celery's pool) in its group.
            for pid, (_, command, group) in processes().items():
                if group != self.runner.pid and parent_of(pid) == self.runner.pid:
                    self.groups[group] = next((name for name in MAKE_RUN_ENTRIES if _entry_runs(name, command)), "other_make_run")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM to the runner, which stops its processes with their grace (25 s); SIGKILL
        to every group still there after 40 s."""
        import shutil

        stopped = False
        try:
            os.killpg(self.runner.pid, signal.SIGTERM)
            self.runner.wait(timeout=40)
            stopped = True  # the runner waits for its processes before it exits
        except subprocess.TimeoutExpired:
            pass
        finally:
            if not stopped:
                for group in self.groups:
                    try:
                        os.killpg(group, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass  # gone already
                self.runner.wait()
            shutil.rmtree(self.prometheus_dir, ignore_errors=True)


def _is_celery_consumer(pid: str, command: str, group: int, seen: dict[str, tuple[int, str, int]]) -> bool:
    """Celery's consumer: the worker group's celery process not started by another one of the
    group's (its pool's processes are its children); not the shell that started it."""
    if "celery" not in command or command.startswith("/bin/sh"):
        return False
    parent = parent_of(pid)
    return parent == group or seen.get(str(parent), (0, "", -1))[2] != group


def _entry_runs(name: str, command: str) -> bool:
    return {"web": "gunicorn", "worker": " worker", "beat": " beat", "receiver": "webhook_receiver.py"}[name] in command


def _peer_start(peers: Path, *, port: int, workers: int, database_url: str, redis_url: str) -> subprocess.Popen[bytes]:
    """drf-idempotency with its Redis backend, as `idem/serve.sh start drfi-redis` starts it,
    with the worker count given (serve.sh always starts 3)."""
    if not (PEER_VENV / "bin" / "gunicorn").exists():
        raise SystemExit(PEER_HOW_TO.format(peers=peers))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TALLY_"))}
    env.update(DJANGO_SETTINGS_MODULE="peer_idem.settings_drfi_redis", DATABASE_URL=database_url, PEER_REDIS_URL=redis_url)
    server = subprocess.Popen(
        [str(PEER_VENV / "bin" / "gunicorn"), "peer_idem.wsgi:application", "--workers", str(workers), "--worker-class", "sync",
         "--bind", f"127.0.0.1:{port}", "--timeout", "30"],
        cwd=peers / "idem", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_ready(port, path="/wallet", host=None)
    except RuntimeError:
        stop(server)
        raise SystemExit(f"the peer did not come up on {port}; is it set up? " + PEER_HOW_TO.format(peers=peers)) from None
    return server


def _database_of(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).path.lstrip("/")


def compare_peer(args: argparse.Namespace, fixtures: dict[str, Any]) -> dict[str, Any]:
    """Tally and the peer back to back, `--rounds` times, same wrk script, clients, seconds
    and worker count. Both pay from one wallet row: Tally one customer through one terminal
    key (the bench tenant charges by customer id), the peer its one wallet."""
    peers = _peers_dir(args.peers_dir)
    lua = peers / "http" / "keyed_post.lua"
    tally_body = json.dumps({"customer": fixtures["customers"][0], "asset": "JPY", "amount": 1})
    tally_auth = f"Bearer {fixtures['hot'][0]}"
    env = bench_env(args.database_url, args.redis_url)
    rounds: list[dict[str, Any]] = []
    classes = ["sync", "gthread"] if args.worker_class == "both" else [args.worker_class]
    stacks = ["make-run", "web"] if args.stack == "both" else [args.stack]
    labels = [_label(c, stack) for stack in stacks for c in classes]
    for _ in range(args.rounds):
        tallies: dict[str, dict[str, Any]] = {}
        for stack in stacks:
            for worker_class in classes:
                label = _label(worker_class, stack)
                if stack == "make-run":
                    made = _MakeRunStack(env, port=args.port, receiver_port=args.receiver_port, workers=args.workers, worker_class=worker_class)
                    halt, groups = made.stop, made.groups
                else:
                    server = gunicorn_start(env, args.port, args.workers, worker_class)
                    halt, groups = functools.partial(stop, server), {server.pid: "web"}
                try:
                    url = f"http://127.0.0.1:{args.port}/v1/terminal/payments"
                    wrk_keyed(url, lua=lua, body=tally_body, auth=tally_auth, host=DOMAIN, clients=args.clients, seconds=2)  # warm-up
                    drained = _events_drained(timeout=300) if stack == "make-run" else None
                    tallies[label], spent = cpu_per_request(groups, _database_of(args.database_url), functools.partial(
                        wrk_keyed, url, lua=lua, body=tally_body, auth=tally_auth, host=DOMAIN, clients=args.clients, seconds=args.seconds
                    ))
                    tallies[label]["cpu_ms_per_request"] = spent
                    if drained is not None:
                        tallies[label]["backlog_drained_s_before"] = drained
                        tallies[label]["events_backlog_after"] = dict(zip(("events", "deliveries"), _events_backlog(), strict=True))
                finally:
                    halt()
        server = _peer_start(peers, port=args.peer_port, workers=args.workers, database_url=args.peer_database_url, redis_url=args.redis_url)
        try:
            url = f"http://127.0.0.1:{args.peer_port}/pay"
            wrk_keyed(url, lua=lua, body='{"amount": 1}', clients=args.clients, seconds=2)  # warm-up
            peer, spent = cpu_per_request(server.pid, _database_of(args.peer_database_url), functools.partial(
                wrk_keyed, url, lua=lua, body='{"amount": 1}', clients=args.clients, seconds=args.seconds
            ))
            peer["cpu_ms_per_request"] = spent
        finally:
            stop(server)
        ratios = {c: round(t["ok_per_s"] / max(peer["ok_per_s"], 0.1), 2) for c, t in tallies.items()}
        rounds.append({"tally": tallies, "peer_drfi_redis": peer, "ratio": ratios})
    return {
        "worker_class": classes, "stack": stacks, "workers": args.workers, "clients": args.clients, "seconds": args.seconds,
        "wrk_script": str(lua), "rounds": rounds, "ratios": {label: [r["ratio"][label] for r in rounds] for label in labels},
    }


def _paired(blocks: dict[str, list[dict[str, Any]]], side: str, other: str, figure: str) -> dict[str, Any]:
    """Each round's `side` / `other` ratio of `figure` (its two blocks ran back to back), their
    median, and each side's mean."""
    ratios = sorted(a[figure] / max(b[figure], 0.001) for a, b in zip(blocks[side], blocks[other], strict=True))
    means = {name: round(sum(b[figure] for b in runs) / len(runs), 3) for name, runs in blocks.items()}
    return {"means": means, "round_ratios": [round(r, 3) for r in ratios], "median_ratio": round(statistics.median(ratios), 3)}


FEE_RATE = "0.025"


def fee_fixtures() -> dict[str, list[str]]:
    """Terminal keys of the spread merchants with a fee schedule of their own (the first half
    by name, given one here if they have none) and of those without."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from django.db import connection
    from django_tenants.utils import schema_context

    from payments.models import FeeSchedule
    from wallets.models import Merchant, Terminal
    from wallets.services.principals import api_key_create

    with schema_context(SCHEMA):
        spread = list(Merchant.objects.filter(name__startswith="Spread merchant").order_by("name"))
        halves = {"fee": spread[: len(spread) // 2], "no_fee": spread[len(spread) // 2 :]}
        for merchant in halves["fee"]:
            # In the past, written before the server starts: no process has cached the merchant yet.
            start = datetime(2026, 1, 1, tzinfo=UTC)
            FeeSchedule.objects.get_or_create(asset_id="JPY", merchant=merchant, valid_from=start, defaults={"rate": Decimal(FEE_RATE)})
        keys = {side: [api_key_create(principal=t)[1] for t in Terminal.objects.filter(store__merchant__in=ms)] for side, ms in halves.items()}
    connection.set_schema_to_public()
    return keys


def compare_fees(args: argparse.Namespace, fixtures: dict[str, Any]) -> dict[str, Any]:
    """Spread traffic to the merchants with a fee and to those without, alternating blocks on one server."""
    keys = fee_fixtures()
    run = drive_wrk if args.driver == "wrk" else drive
    server = gunicorn_start(bench_env(args.database_url, args.redis_url), args.port, args.workers)
    blocks: dict[str, list[dict[str, Any]]] = {"fee": [], "no_fee": []}

    def block(side: str, seconds: float) -> dict[str, Any]:
        result = run(args.port, keys[side], fixtures["customers"], clients=args.clients, seconds=seconds)
        statuses = result["statuses"]
        result["requests"] = sum(statuses.values())
        result["non2xx"] = result["requests"] - statuses.get(201, statuses.get("2xx", 0))
        return result

    try:
        for side in blocks:
            block(side, 2)  # warm-up
        for index in range(args.rounds):
            for side in ("fee", "no_fee") if index % 2 == 0 else ("no_fee", "fee"):
                result, spent = cpu_per_request(server.pid, _database_of(args.database_url), functools.partial(block, side, args.seconds))
                # The server's CPU a payment (gunicorn and its PostgreSQL backends): what other work on the machine moves least.
                result["cpu_ms_per_payment"] = round(spent["web"] + spent["postgres"], 3)
                blocks[side].append(result)
    finally:
        stop(server)

    return {
        "workers": args.workers, "clients": args.clients, "seconds": args.seconds, "rounds": args.rounds, "driver": args.driver,
        "fee_rate": FEE_RATE, "blocks": blocks, "payments_per_s": _paired(blocks, "fee", "no_fee", "payments_per_s"),
        "cpu_ms_per_payment": _paired(blocks, "fee", "no_fee", "cpu_ms_per_payment"),
    }


def _daily_totals_phase(phase: str) -> None:
    """Put the bench tenant's `account_daily_totals` at `phase` (expanded: payments write their
    customer and system legs' daily totals; absent: not), then wait until every gunicorn
    worker has seen it (the phase cache's TTL and grace)."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from wallets.daily_totals import ACCOUNTS_MIGRATION
    from wallets.models import StagedMigrationState
    from wallets.staged.phases import staged_fence_seconds

    with schema_context(SCHEMA):
        StagedMigrationState.objects.update_or_create(name=ACCOUNTS_MIGRATION, defaults={"phase": phase})
    connection.set_schema_to_public()
    time.sleep(staged_fence_seconds())


def compare_daily_totals(args: argparse.Namespace, fixtures: dict[str, Any]) -> dict[str, Any]:
    """Spread payments with the customer and system accounts' daily totals written (staged
    migration `account_daily_totals` expanded) and not (absent), alternating blocks on one server."""
    run = drive_wrk if args.driver == "wrk" else drive
    server = gunicorn_start(bench_env(args.database_url, args.redis_url), args.port, args.workers)
    blocks: dict[str, list[dict[str, Any]]] = {"written": [], "not_written": []}
    phases = {"written": "expanded", "not_written": "absent"}

    def block(side: str, seconds: float) -> dict[str, Any]:
        result = run(args.port, fixtures["spread"], fixtures["customers"], clients=args.clients, seconds=seconds)
        statuses = result["statuses"]
        result["requests"] = sum(statuses.values())
        result["non2xx"] = result["requests"] - statuses.get(201, statuses.get("2xx", 0))
        return result

    try:
        block("not_written", 2)  # warm-up
        for index in range(args.rounds):
            for side in ("written", "not_written") if index % 2 == 0 else ("not_written", "written"):
                _daily_totals_phase(phases[side])
                result, spent = cpu_per_request(server.pid, _database_of(args.database_url), functools.partial(block, side, args.seconds))
                result["cpu_ms_per_payment"] = round(spent["web"] + spent["postgres"], 3)
                blocks[side].append(result)
    finally:
        stop(server)
        _daily_totals_phase("absent")

    return {
        "workers": args.workers, "clients": args.clients, "seconds": args.seconds, "rounds": args.rounds, "driver": args.driver,
        "blocks": blocks, "payments_per_s": _paired(blocks, "written", "not_written", "payments_per_s"),
        "cpu_ms_per_payment": _paired(blocks, "written", "not_written", "cpu_ms_per_payment"),
    }


def _hot_endpoint_subscribe(*, every_event: bool) -> None:
    """The hot merchant's enabled endpoint subscribed to every event, or to none a payment
    writes (its payments then make no delivery)."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from webhooks.models import WebhookEndpoint, WebhookEndpointStatus

    with schema_context(SCHEMA):
        WebhookEndpoint.objects.filter(merchant__name="Hot merchant", status=WebhookEndpointStatus.ENABLED).update(
            enabled_events=["*"] if every_event else ["payout.paid"]
        )
    connection.set_schema_to_public()


def _deliveries_since(since: Any) -> dict[str, Any]:
    """The bench tenant's deliveries that succeeded for events created at or after `since`:
    how many, and the lag from the event's `created` to its delivered attempt's start."""
    from django.db import connection
    from django.db.models import F
    from django_tenants.utils import schema_context

    from webhooks.models import WebhookDelivery, WebhookDeliveryStatus

    with schema_context(SCHEMA):
        lags = sorted(
            lag.total_seconds() * 1000
            for lag in WebhookDelivery.objects.filter(event_created__gte=since, status=WebhookDeliveryStatus.SUCCEEDED)
            .annotate(lag=F("delivered_at") - F("event_created")).values_list("lag", flat=True)
        )
    connection.set_schema_to_public()

    def pct(q: float) -> float:
        return round(lags[min(len(lags) - 1, int(q * len(lags)))], 1) if lags else 0.0

    return {"delivered": len(lags), "lag_p50_ms": pct(0.5), "lag_p99_ms": pct(0.99), "lag_max_ms": pct(1.0)}


def compare_webhook_cost(args: argparse.Namespace, fixtures: dict[str, Any]) -> dict[str, Any]:
    """Keyed payments on `make run`'s stack with the hot merchant's endpoint subscribed to every
    event and to none, alternating blocks: payments/s, p99, CPU per process, the worker's CPU per
    delivered event and the delivery lag."""
    from django.utils import timezone

    lua = _peers_dir(args.peers_dir) / "http" / "keyed_post.lua"
    body = json.dumps({"customer": fixtures["customers"][0], "asset": "JPY", "amount": 1})
    auth = f"Bearer {fixtures['hot'][0]}"
    url = f"http://127.0.0.1:{args.port}/v1/terminal/payments"
    stack = _MakeRunStack(
        bench_env(args.database_url, args.redis_url), port=args.port, receiver_port=args.receiver_port, workers=args.workers,
        worker_class="sync",
    )
    blocks: dict[str, list[dict[str, Any]]] = {"with": [], "without": []}
    try:
        wrk_keyed(url, lua=lua, body=body, auth=auth, host=DOMAIN, clients=args.clients, seconds=2)  # warm-up
        for index in range(args.rounds):
            for side in ("with", "without") if index % 2 == 0 else ("without", "with"):
                _hot_endpoint_subscribe(every_event=side == "with")
                _events_drained(timeout=300)
                since = timezone.now()
                result, spent = cpu_per_request(stack.groups, _database_of(args.database_url), functools.partial(
                    wrk_keyed, url, lua=lua, body=body, auth=auth, host=DOMAIN, clients=args.clients, seconds=args.seconds
                ))
                result["cpu_ms_per_payment"] = spent
                result["drained_s_after"] = _events_drained(timeout=300)
                result.update(_deliveries_since(since))
                ok = result["requests"] - result["non2xx"]
                result["worker_cpu_s"] = round(spent["worker"] * ok / 1000, 2)
                if result["delivered"]:
                    result["worker_ms_per_delivery"] = round(spent["worker"] * ok / result["delivered"], 3)
                blocks[side].append(result)
    finally:
        stack.stop()
        _hot_endpoint_subscribe(every_event=True)

    over_without = [
        round((w["worker_cpu_s"] - n["worker_cpu_s"] * w["seconds"] / n["seconds"]) * 1000 / max(w["delivered"], 1), 3)
        for w, n in zip(blocks["with"], blocks["without"], strict=True)
    ]
    return {
        "workers": args.workers, "clients": args.clients, "seconds": args.seconds, "blocks": blocks,
        "payments_per_s": _paired(blocks, "with", "without", "ok_per_s"), "worker_ms_per_delivery_over_without": over_without,
    }


def _label(worker_class: str, stack: str) -> str:
    return worker_class if stack == "web" else f"{worker_class}+{stack}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3, help="gunicorn workers")
    parser.add_argument("--worker-class", choices=["sync", "gthread", "both"], default="sync",
                        help="with --peer: Tally's gunicorn worker (gthread keeps connections alive; one thread); both = each, per round")
    parser.add_argument(
        "--stack", choices=["web", "make-run", "both"], default="web",
        help="with --peer: Tally's processes. web = gunicorn alone, the events its payments write left unpublished; "
        "make-run = what `make run` starts, under its runner: gunicorn, the Celery worker and beat, and the documented "
        "webhook receiver, with an endpoint for the hot merchant, so each payment's event is relayed and delivered during "
        "the load (the PSP simulator, which no payment calls, is left out); both = each, per round (make-run first)",
    )
    parser.add_argument("--receiver-port", type=int, default=8769, help="with --stack make-run: the webhook receiver's")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_http")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--skip-rawsql", action="store_true")
    parser.add_argument("--driver", choices=["python", "wrk"], default="python",
                        help="load generator: Python clients (no extra install) or wrk (lighter on the 2 cores)")
    parser.add_argument("--peer", action="store_true",
                        help="instead: Tally vs the drf-idempotency peer (Redis backend), same wrk script, back to back, and the ratio")
    parser.add_argument("--rounds", type=int, default=2, help="with --peer: Tally-then-peer rounds; with --fees: rounds of both blocks")
    parser.add_argument("--fees", action="store_true",
                        help="instead: spread payments to merchants with a fee schedule against merchants without one, alternating blocks")
    parser.add_argument("--daily-totals", action="store_true",
                        help="instead: spread payments with the customer and system accounts' daily totals written and not, alternating blocks")
    parser.add_argument("--webhook-cost", action="store_true",
                        help="instead: keyed payments on make run's stack with the hot merchant's endpoint subscribed and not, alternating blocks")
    parser.add_argument("--peers-dir", default=None, help="with --peer: ../shared/peers (found next to the checkout by default)")
    parser.add_argument("--peer-port", type=int, default=8766)
    parser.add_argument("--peer-database-url", default="postgres://postgres@127.0.0.1:5432/peer_idem")
    args = parser.parse_args()
    if args.worker_class != "sync" and not args.peer:
        parser.error("--worker-class needs --peer")
    if args.stack != "web" and not args.peer:
        parser.error("--stack needs --peer")
    # A stop signal unwinds through the finally clauses that stop the servers: their
    # processes run in sessions of their own, which the signal does not reach.
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, lambda signum, _: sys.exit(128 + signum))
    fixtures = seed(args.database_url, args.redis_url)
    if args.fees:
        print(json.dumps(compare_fees(args, fixtures), indent=2))
        return
    if args.daily_totals:
        print(json.dumps(compare_daily_totals(args, fixtures), indent=2))
        return
    if args.webhook_cost:
        print(json.dumps(compare_webhook_cost(args, fixtures), indent=2))
        return
    if args.peer:
        print(json.dumps(compare_peer(args, fixtures), indent=2))
        return
    run = drive_wrk if args.driver == "wrk" else drive
    server = gunicorn_start(bench_env(args.database_url, args.redis_url), args.port, args.workers)
    result: dict[str, Any] = {"workers": args.workers, "clients": args.clients, "seconds": args.seconds, "driver": args.driver}
    try:
        run(args.port, fixtures["spread"], fixtures["customers"], clients=args.clients, seconds=2)  # warm-up
        result["http_spread"] = run(args.port, fixtures["spread"], fixtures["customers"], clients=args.clients, seconds=args.seconds)
        result["http_hot"] = run(args.port, fixtures["hot"], fixtures["customers"], clients=args.clients, seconds=args.seconds)
    finally:
        stop(server)
    if not args.skip_rawsql:
        from bench.rawsql import run_ceiling

        ceiling = run_ceiling(clients=args.clients, seconds=args.seconds)
        result["rawsql"] = ceiling
        result["ratio_spread"] = round(result["http_spread"]["payments_per_s"] / ceiling["rawsql_spread_tps"], 3)
        result["ratio_hot"] = round(result["http_hot"]["payments_per_s"] / ceiling["rawsql_hot_tps"], 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
