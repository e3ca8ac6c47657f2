from .base import *  # noqa: F403
from .base import env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
# `make run` points the demo merchant's webhook endpoint at a receiver on 127.0.0.1.
TALLY_WEBHOOK_ALLOW_HTTP = env.bool("TALLY_WEBHOOK_ALLOW_HTTP", default=True)
TALLY_WEBHOOK_ALLOW_LOOPBACK = env.bool("TALLY_WEBHOOK_ALLOW_LOOPBACK", default=True)
