from .base import *  # noqa: F403
from .base import BASE_DIR, env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
# `make run` points the demo merchant's webhook endpoint at a receiver on 127.0.0.1.
TALLY_WEBHOOK_ALLOW_HTTP = env.bool("TALLY_WEBHOOK_ALLOW_HTTP", default=True)
TALLY_WEBHOOK_ALLOW_LOOPBACK = env.bool("TALLY_WEBHOOK_ALLOW_LOOPBACK", default=True)

# `make run` writes a ring here on its first run (devtools/run.py) and reuses it.
_ring_file = BASE_DIR / "var" / "sealing_keys"
TALLY_SEALING_KEYS = [k for k in env.list("TALLY_SEALING_KEYS", default=[]) if k.strip()] or (
    _ring_file.read_text().strip().split(",") if _ring_file.exists() else []
)
