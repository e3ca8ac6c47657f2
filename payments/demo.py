"""The demo tenant `make run` seeds, idempotently. Keys are stored hashed, so the raw demo
keys are kept in var/demo_keys.json (local, git-ignored) to be printed again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django_tenants.utils import schema_context

from payments.models import Adjustment
from payments.services.adjustments import adjustment_create
from payments.services.topups import gateway_account_set
from tenants.models import Tenant
from tenants.services import platform_ensure, tenant_create
from wallets.ids import random_token
from wallets.models import Asset, Customer, Merchant, StaffMember, Store, Terminal
from wallets.selectors import api_key_get_active
from wallets.services.principals import (
    api_key_create,
    customer_create,
    merchant_create,
    staff_member_get_or_create,
    store_create,
    terminal_create,
)
from wallets.services.roles import staff_login_ensure, staff_roles_ensure

DEMO_SCHEMA = "demo"
KEYS_FILE = Path(settings.BASE_DIR) / "var" / "demo_keys.json"
DEMO_STARTING_BALANCES = {"alice": 50_000, "bob": 20_000}  # JPY
DEMO_FUNDING_REASON = "demo starting balance"


def _platform_superuser_ensure(username: str, password: str) -> None:
    """The platform admin (public schema): a login of its own, separate from every tenant's
    staff (auth lives in each schema). Its password is set on every seed."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()


# The demo tenant's back-office logins (one per role, wallets.services.roles), all with the
# seed's password: `operator` and `finance` show the roles, `finance2` is the second
# staff member that approves `finance`'s adjustments above the threshold.
DEMO_STAFF = {"admin": None, "viewer": "viewer", "operator": "operator", "finance": "finance", "finance2": "finance"}


def demo_seed(*, keys_file: Path = KEYS_FILE) -> dict[str, Any]:
    """Create the demo tenant and its parties once; return what to print (keys, logins)."""
    keys_file.parent.mkdir(exist_ok=True)
    saved: dict[str, Any] = json.loads(keys_file.read_text()) if keys_file.exists() else {}
    platform_ensure(public_domain=settings.TALLY_PUBLIC_DOMAIN)
    password = saved.get("admin_password") or random_token(16)
    _platform_superuser_ensure("admin", password)  # public-schema admin: tenants and domains

    if not Tenant.objects.filter(schema_name=DEMO_SCHEMA).exists():
        tenant_create(schema_name=DEMO_SCHEMA, domain=settings.TALLY_DEMO_DOMAIN, name="Demo Town", main_currency="JPY")
    keys: dict[str, str] = saved.get("keys", {})
    with schema_context(DEMO_SCHEMA):
        # The operator's staff: their passwords are (re)set to the printed one on every seed.
        staff_roles_ensure()
        for username, role in DEMO_STAFF.items():
            staff_login_ensure(username=username, password=password, role=role, superuser=role is None)
        alice = Customer.objects.filter(name="Alice").first() or customer_create(name="Alice", email="alice@example.com")
        bob = Customer.objects.filter(name="Bob").first() or customer_create(name="Bob", email="bob@example.com")
        merchant = Merchant.objects.filter(name="Corner Café").first() or merchant_create(name="Corner Café")
        store = Store.objects.filter(merchant=merchant).first() or store_create(merchant=merchant, name="Main Street")
        terminal = Terminal.objects.filter(store=store).first() or terminal_create(store=store, name="Till 1")
        staff = staff_member_get_or_create(username="admin")
        principals: dict[str, Customer | Merchant | Terminal | StaffMember] = {
            "customer_alice": alice, "customer_bob": bob, "merchant": merchant, "terminal": terminal, "staff": staff,
        }
        for label, principal in principals.items():
            # var/ may have been seeded against another database (local server vs embedded):
            # reuse a saved key only if it is live here and still names this principal.
            saved_key = api_key_get_active(raw_key=keys[label]) if label in keys else None
            if saved_key is None or saved_key.principal_id != principal.pk:
                _, keys[label] = api_key_create(principal=principal)
        _demo_balances_ensure(customers={"alice": alice, "bob": bob})
        ids = {"alice": alice.id, "bob": bob.id, "merchant": merchant.id, "store": store.id, "terminal": terminal.id}
    saved = {"admin_password": password, "keys": keys, "ids": ids}
    keys_file.write_text(json.dumps(saved, indent=2))
    keys_file.chmod(0o600)
    return saved


def _demo_balances_ensure(*, customers: dict[str, Customer]) -> None:
    """Fund the demo customers once, through the same adjustment service staff use."""
    staff = staff_member_get_or_create(username="admin")
    main_currency = Asset.objects.get(is_main=True).code
    for label, customer in customers.items():
        if Adjustment.objects.filter(customer=customer, reason=DEMO_FUNDING_REASON).exists():
            continue
        adjustment_create(
            staff=staff, customer=customer, asset_code=main_currency, amount=DEMO_STARTING_BALANCES[label],
            direction="credit", reason=DEMO_FUNDING_REASON,
        )


def demo_psp_ensure(*, psp_url: str, webhook_url: str, state_file: Path) -> dict[str, str]:
    """`make run`: make the PSP simulator the demo tenant's card gateway. Its API key and
    webhook secret are kept in `state_file` (0600), which the simulator reads at start to
    know where to send the demo tenant's signed webhooks."""
    saved: dict[str, Any] = json.loads(state_file.read_text()) if state_file.exists() else {}
    api_key = str(saved.get("api_key") or f"sk_sim_{random_token(16)}")
    secret = str(saved.get("webhook_secret") or f"whsec_{random_token(24)}")
    with schema_context(DEMO_SCHEMA):
        gateway_account_set(gateway="simulator", api_base=psp_url, secret_key=api_key, webhook_secrets=[secret])
    state_file.write_text(json.dumps({"api_key": api_key, "webhook_secret": secret, api_key: [{"url": webhook_url, "secret": secret}]}))
    state_file.chmod(0o600)
    return {"api_key": api_key, "webhook_url": webhook_url}
