"""`make run`: pick servers, migrate, seed the demo tenant, start every process.

Processes come from the Procfile and run under supervisord, in this process
(`devtools.procfile`): one that exits is started again, with a backoff when it keeps
failing; Ctrl-C stops them all.
Embedded PostgreSQL/Redis (when no server answers) keep running under var/ so the
next `make run` reuses the same data.
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
from collections.abc import MutableMapping
from pathlib import Path

from devtools.localservices import ROOT, VAR, resolve
from devtools.procfile import processes_run, procfile_read

ENV_FILE = ROOT / ".env"

# What `make run` sets unless the environment or `.env` says otherwise: beat's
# scheduled-payouts run every 20 s instead of hourly, so the demo merchant's daily payout
# goes out within seconds of the start, as the banner says (each merchant is still paid
# at most once a UTC day).
RUN_DEFAULTS = {"TALLY_PAYOUT_SCHEDULE_SECONDS": "20"}


def run_defaults_apply(environ: MutableMapping[str, str]) -> None:
    """`RUN_DEFAULTS` into `environ`, where it has no value of its own."""
    for name, value in RUN_DEFAULTS.items():
        environ.setdefault(name, value)


def payouts_banner_line(*, schedule_seconds: int) -> str:
    """The banner's promise about the demo payout, from beat's period as the settings have it."""
    return (
        "  payouts:              the demo merchant is paid out daily to its bank account at the simulator: beat's scheduled-payouts"
        f" run, every {schedule_seconds} s here (TALLY_PAYOUT_SCHEDULE_SECONDS), pays what it holds (its opening ¥30,000 and its takings)"
        f" within {schedule_seconds} s"
        " of beat's start; the payout goes paid and its payout.paid reaches the receiver (admin: Payments -> Payouts)"
    )


def main() -> int:
    env = resolve(database=os.environ.get("TALLY_DB_NAME", "tally"), embedded_ok=True)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    prom_dir = VAR / "prometheus"
    shutil.rmtree(prom_dir, ignore_errors=True)
    prom_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(prom_dir)
    new_ring = _sealing_ring_ensure()  # reads `.env` too, which wins over RUN_DEFAULTS
    run_defaults_apply(os.environ)  # before the settings load; every process started below inherits it

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    from devtools.demo_seed import DEMO_DOMAIN, demo_psp_ensure, demo_seed, demo_webhook_endpoint_ensure, platform_ensure

    print(f"database: {_redact(env['DATABASE_URL'])}\nredis:    {env['REDIS_URL']}", flush=True)
    call_command("migrate_schemas", "--shared", interactive=False, verbosity=0)
    platform_ensure(public_domain=settings.TALLY_PUBLIC_DOMAIN)  # template schema must exist before tenants migrate
    call_command("migrate_schemas", interactive=False, verbosity=0)
    if new_ring:
        _legacy_reseal()
    seeded = demo_seed()  # (re)sets the demo logins' password to the one printed below
    # The admin's CSS and the API docs' assets, served by whitenoise under gunicorn.
    call_command("collectstatic", interactive=False, verbosity=0)
    # The demo merchant's webhook endpoint -> the receiver the Procfile starts (docs/WEBHOOKS.md).
    receiver_port = os.environ.setdefault("TALLY_WEBHOOK_RECEIVER_PORT", "8765")
    hook = demo_webhook_endpoint_ensure(
        merchant_id=seeded["ids"]["merchant"], url=f"http://127.0.0.1:{receiver_port}/webhooks", state_file=VAR / "demo_webhook.json"
    )
    os.environ["TALLY_WEBHOOK_SECRET"] = hook["secret"]  # for the receiver process only
    # Card top-ups: the PSP simulator the Procfile starts is the demo tenant's gateway.
    psp_port = os.environ.setdefault("TALLY_PSP_PORT", "8766")
    port = os.environ.setdefault("PORT", "8000")
    demo = DEMO_DOMAIN
    psp = demo_psp_ensure(
        psp_url=f"http://127.0.0.1:{psp_port}", webhook_url=f"http://{demo}:{port}/v1/psp/webhooks/simulator",
        state_file=VAR / "psp_simulator.json", merchant_id=seeded["ids"]["merchant"],
    )

    lines = [
        "",
        "Tally is starting (web, Celery worker, Celery beat, the demo merchant's webhook receiver, the PSP simulator)"
        " under supervisord: a process that exits is started again. Ctrl-C stops everything.",
        f"  admin (demo tenant):  http://{demo}:{port}/admin/   user admin / {seeded['admin_password']}",
        "                        (also viewer, operator, finance, finance2: one per role, same password; set on every run)",
        f"  admin (platform):     http://{settings.TALLY_PUBLIC_DOMAIN}:{port}/admin/   user admin / same password"
        " (a separate platform login, not a tenant's staff)",
        f"  API docs:             http://{demo}:{port}/v1/docs",
        f"  readiness:            curl -H 'Host: {demo}' http://127.0.0.1:{port}/readyz",
        f"  webhooks:             the demo merchant's endpoint {hook['endpoint']} -> http://127.0.0.1:{receiver_port}/webhooks"
        " (the `receiver` lines below print each event it gets)",
        f"  PSP simulator:        http://127.0.0.1:{psp_port}  (card top-ups: pm_card_visa, pm_card_declined; faults: POST /_control/faults;"
        f" it signs webhooks to {psp['webhook_url']})",
        payouts_banner_line(schedule_seconds=int(settings.TALLY_PAYOUT_SCHEDULE_SECONDS)),
        "  history:              the demo has activity from the first of last month to yesterday (payments at three shops, refunds,"
        " transfers, top-ups) and one reconciliation run:",
        f"    dashboard            http://{demo}:{port}/admin/reconciliation/reconciliationrun/dashboard/",
        f"    trial balance        http://{demo}:{port}/admin/reconciliation/reconciliationrun/trial-balance/   (admin or finance)",
        f"    month-end report     http://{demo}:{port}/admin/reconciliation/reconciliationrun/month-end/   (last month by default)",
        f"    statements           GET http://{demo}:{port}/v1/merchant/statements?asset=JPY&month=<last month>  (merchant key below)",
        "  demo keys (Authorization: Bearer <key>):",
    ]
    lines += [f"    {label:<16} {key}" for label, key in seeded["keys"].items()]
    lines += ["  demo ids: " + ", ".join(f"{k}={v}" for k, v in seeded["ids"].items()), ""]
    print("\n".join(lines), flush=True)

    os.environ["VENV_BIN"] = str(Path(sys.executable).parent)
    connections.close_all()  # this process becomes supervisord: it holds no database session
    return processes_run(procfile_read(ROOT / "Procfile"), cwd=ROOT)


def _sealing_ring_ensure() -> bool:
    """TALLY_SEALING_KEYS from the environment or `.env` (read as the settings read it),
    else var/sealing_keys, written with a new random key on the first run
    (wallets/sealing.py). True when it was just written."""
    if ENV_FILE.exists():
        import environ

        environ.Env.read_env(str(ENV_FILE))  # setdefault: the environment still wins, as in the settings
    if os.environ.get("TALLY_SEALING_KEYS"):
        return False
    ring_file = VAR / "sealing_keys"
    new = not ring_file.exists()
    if new:
        VAR.mkdir(parents=True, exist_ok=True)
        # A random id: a key regenerated here (var/ wiped) is never taken for the old one.
        entry = f"local-{os.urandom(4).hex()}:" + base64.urlsafe_b64encode(os.urandom(32)).decode("ascii") + "\n"
        # Created owner-only, never readable by others even for a moment.
        fd = os.open(ring_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(entry)
    os.environ["TALLY_SEALING_KEYS"] = ring_file.read_text().strip()
    return new


def _legacy_reseal() -> None:
    """A database `make run` used before it had a ring holds values sealed under the local
    SECRET_KEY (an older release): re-seal them once under the new ring, the documented
    upgrade (README.md, 'Sealing keys') done for the local database."""
    from django.conf import settings
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from wallets.sealing import sealing_ring_forget

    settings.TALLY_SEALING_LEGACY_SECRET_KEY = settings.SECRET_KEY
    sealing_ring_forget()
    try:
        call_command("secrets_reseal", verbosity=0)
    except CommandError as exc:  # values sealed under some other key: the demo setup below replaces its own
        print(f"secrets_reseal: {exc}", flush=True)
    finally:
        settings.TALLY_SEALING_LEGACY_SECRET_KEY = ""
        sealing_ring_forget()


def _redact(url: str) -> str:
    if "@" in url and ":" in url.split("@")[0].split("//")[-1]:
        scheme, rest = url.split("//", 1)
        creds, host = rest.split("@", 1)
        return f"{scheme}//{creds.split(':')[0]}:***@{host}"
    return url


if __name__ == "__main__":
    raise SystemExit(main())
