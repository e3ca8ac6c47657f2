import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup(set_prefix=False)  # as get_wsgi_application(); the handler sets the prefix per request

from fastpath.handlers import ApiSplitHandler  # noqa: E402  (after setup: it imports models)

application = ApiSplitHandler()
