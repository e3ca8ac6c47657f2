"""`make run` prints a login that works whether or not the database already existed:
the seed sets the printed password on every run, for the demo tenant's staff
(one login per role) and for the platform admin (a separate login in the public schema)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django_tenants.utils import schema_context

from devtools.demo_seed import DEMO_SCHEMA, DEMO_STAFF, demo_seed


def _password_works(username: str, password: str, *, schema: str) -> bool:
    with schema_context(schema):
        user = get_user_model().objects.get(username=username)
        return bool(user.check_password(password) and user.is_staff and user.is_active)


def test_the_printed_login_works_on_an_existing_database(django_db_setup: None, django_db_blocker: Any, tmp_path: Path) -> None:
    with django_db_blocker.unblock():
        first = demo_seed(keys_file=tmp_path / "one.json")
        # A second clone (its own var/, so another printed password) against the same database:
        second = demo_seed(keys_file=tmp_path / "two.json")
        assert second["admin_password"] != first["admin_password"]
        for username in DEMO_STAFF:
            assert _password_works(username, second["admin_password"], schema=DEMO_SCHEMA), username
        assert _password_works("admin", second["admin_password"], schema="public")
        # Someone changed it in the database; the next `make run` prints and sets its own again.
        with schema_context(DEMO_SCHEMA):
            user = get_user_model().objects.get(username="admin")
            user.set_password("changed-by-hand")
            user.save()
        again = demo_seed(keys_file=tmp_path / "one.json")
        assert again["admin_password"] == json.loads((tmp_path / "one.json").read_text())["admin_password"] == first["admin_password"]
        assert _password_works("admin", first["admin_password"], schema=DEMO_SCHEMA)
        with schema_context(DEMO_SCHEMA):
            roles = {u.username: [g.name for g in u.groups.all()] for u in get_user_model().objects.filter(username__in=DEMO_STAFF)}
        assert roles == {"admin": [], "viewer": ["viewer"], "operator": ["operator"], "finance": ["finance"], "finance2": ["finance"]}
        connection.set_schema_to_public()
