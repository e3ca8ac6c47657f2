"""The demo tenant `make run` seeds, idempotently: its logins, parties, API keys and
balances, a fee schedule, the PSP simulator as its card gateway and the demo merchant's bank
account at it (paid out daily), the demo merchant's webhook endpoint, and a history of
activity from the first day of last month to yesterday (demo_history_ensure), after which
reconciliation runs once.
Keys are stored hashed, so the raw demo keys are kept in var/demo_keys.json (local,
git-ignored) to be printed again.

By hand: `python manage.py shell -c "from devtools.demo_seed import demo_seed; demo_seed()"`.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import time_machine
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone
from django_tenants.utils import schema_context

from payments.models import Adjustment, FeeSchedule, MerchantBankAccount, Payment
from payments.selectors import fee_terms_forget
from payments.services.adjustments import adjustment_create
from payments.services.charges import payment_create_with_token
from payments.services.fees import fee_schedule_create
from payments.services.payouts import bank_account_save, merchant_payout_schedule_set
from payments.services.refunds import refund_create
from payments.services.tokens import payment_token_create
from payments.services.topups import gateway_account_set
from payments.services.transfers import transfer_create
from reconciliation.models import ReconciliationRun, RunStatus, RunTrigger
from reconciliation.services import reconciliation_run_execute, reconciliation_run_request
from tenants.models import Domain, Tenant
from tenants.selectors import tenant_zone
from tenants.services import tenant_create, tenant_template_ensure
from wallets.ids import random_token
from wallets.models import Asset, Customer, LedgerTransactionKind, Merchant, StaffMember, Store, SystemRole, Terminal
from wallets.sealing import UNOPENED
from wallets.selectors import account_of, api_key_get_active, system_account_get
from wallets.services.audit import audit_record
from wallets.services.ledger import Leg, ledger_post
from wallets.services.principals import (
    api_key_create,
    customer_create,
    merchant_create,
    staff_member_get_or_create,
    store_create,
    terminal_create,
)
from wallets.services.roles import staff_roles_ensure
from webhooks.errors import WebhookEndpointLimitReached
from webhooks.models import WebhookEndpoint, WebhookEndpointStatus
from webhooks.secrets import WebhookSecretUnavailable, webhook_endpoint_secrets
from webhooks.services.endpoints import webhook_endpoint_create, webhook_endpoint_secret_rotate, webhook_endpoint_update

DEMO_SCHEMA = "demo"
DEMO_DOMAIN = os.environ.get("TALLY_DEMO_DOMAIN", "demo.localhost")
KEYS_FILE = Path(settings.BASE_DIR) / "var" / "demo_keys.json"
DEMO_STARTING_BALANCES = {"alice": 50_000, "bob": 20_000}  # JPY
DEMO_FUNDING_REASON = "demo starting balance"
DEMO_FEE_RATE = Decimal("0.025")  # 2.5 % of each payment in the main currency, half-even, no fixed part
DEMO_MERCHANT_OPENING = 30_000  # JPY, dated before the settlement delay: available for the first daily payout
DEMO_BANK_ACCOUNT = "ba_demo_corner_cafe"


def platform_ensure(*, public_domain: str) -> Tenant:
    """The public tenant (platform admin host) and the template schema. Idempotent."""
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
    public: Tenant
    public, _ = Tenant.objects.get_or_create(schema_name="public", defaults={"name": "Tally platform", "main_currency": "XXX"})
    Domain.objects.get_or_create(domain=public_domain, defaults={"tenant": public, "is_primary": True})
    tenant_template_ensure()
    return public


def _platform_superuser_ensure(username: str, password: str) -> None:
    """The platform admin (public schema): a login of its own, separate from every tenant's
    staff (auth lives in each schema). Its password is set on every seed."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()


@transaction.atomic
def staff_login_ensure(*, username: str, password: str, role: str | None = None, superuser: bool = False) -> StaffMember:
    """A tenant staff login with this password (set on every call: the one `make run` prints
    works), in `role`'s group, with its StaffMember (the demo, tests)."""
    user, _ = get_user_model().objects.get_or_create(username=username)
    user.is_staff = user.is_active = True
    user.is_superuser = superuser
    user.set_password(password)
    user.save()
    if role is not None:
        user.groups.set([staff_roles_ensure()[role]])
    return StaffMember.objects.get_or_create(user=user)[0]


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
        tenant_create(schema_name=DEMO_SCHEMA, domain=DEMO_DOMAIN, name="Demo Town", main_currency="JPY")
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
        demo_history_ensure(customers=[alice, bob], terminal=terminal)
        if not FeeSchedule.objects.exists():
            # Through the service, so it starts once every process can know it (seconds from now).
            fee_schedule_create(asset_code=Asset.objects.get(is_main=True).code, rate=DEMO_FEE_RATE)
        ids = {"alice": alice.id, "bob": bob.id, "merchant": merchant.id, "store": store.id, "terminal": terminal.id}
        demo_reconciliation_ensure()
    saved = {"admin_password": password, "keys": keys, "ids": ids}
    keys_file.write_text(json.dumps(saved, indent=2))
    keys_file.chmod(0o600)
    return saved


# The demo's history: a few weeks of a small town's activity, written THROUGH THE SAME
# SERVICES as live traffic, each call under a dev-only clock (time-machine) set to the
# moment it happens, so every stamp agrees: the ledger's `created`, the merchants' daily
# totals, the payments', refunds', transfers' and outbox events' rows, the fee in force.
# The ledger is append-only: nothing is backdated by UPDATE.

DEMO_HISTORY_TOPUP = "demo history: cash top-up at the town office"
DEMO_HISTORY_SEED = 2026  # the same history on every fresh database
DEMO_HISTORY_CUSTOMERS = (("Chika", "chika@example.com"), ("Dan", "dan@example.com"))
DEMO_HISTORY_SHOPS = (("Book Nook", "Station Road"), ("Green Grocer", "Market Square"))
DEMO_HISTORY_PRICES = (350, 480, 520, 780, 980, 1200, 1500, 2400, 3200)  # JPY
DEMO_HISTORY_WEEKLY_TOPUP = 15_000  # JPY, each customer, every Monday (and on the first day)


@dataclass
class _History:
    """What the history has put in each party's hands so far: a payment, refund or transfer
    is written only when the party held enough at its moment, so a balance read at any
    instant of the history is never below zero (the live balance row would allow more)."""

    held: dict[str, int] = field(default_factory=dict)
    written: int = 0

    def has(self, party_id: str, amount: int) -> bool:
        return self.held.get(party_id, 0) >= amount

    def move(self, party_id: str, amount: int) -> None:
        self.held[party_id] = self.held.get(party_id, 0) + amount
        self.written += 1


def demo_history_start(*, today: date) -> date:
    """The first day of last month (in the tenant's zone): last month is complete."""
    return (today.replace(day=1) - timedelta(days=1)).replace(day=1)


def demo_history_ensure(*, customers: list[Customer], terminal: Terminal, say: Callable[[str], None] = print) -> int:
    """Write the demo's history once (none when its first top-up is there), in one
    transaction: a fresh or a reused database gets all of it or none. Returns the number of
    business operations written. Locks: those of the services it calls."""
    if Adjustment.objects.filter(reason=DEMO_HISTORY_TOPUP).exists():
        return 0
    zone = tenant_zone()
    today = timezone.now().astimezone(zone).date()
    first = demo_history_start(today=today)
    start = datetime.combine(first, time(7), tzinfo=zone)
    rng = random.Random(DEMO_HISTORY_SEED)
    staff = staff_member_get_or_create(username="admin")
    main_currency = Asset.objects.get(is_main=True).code
    history = _History()
    with transaction.atomic():
        # The statements and the trial balance answer from the tenant's creation on: the
        # tenant's row says it existed when its history began.
        opened = datetime.combine(first, time(0), tzinfo=zone)
        Tenant.objects.filter(schema_name=DEMO_SCHEMA, created__gt=opened).update(created=opened)
        _demo_history_fee_schedule(asset_code=main_currency, valid_from=start - timedelta(minutes=30))
        with time_machine.travel(start - timedelta(minutes=20), tick=False):
            people = customers + [Customer.objects.filter(name=name).first() or customer_create(name=name, email=email)
                                  for name, email in DEMO_HISTORY_CUSTOMERS]
            tills = [terminal]
            for name, street in DEMO_HISTORY_SHOPS:
                shop = Merchant.objects.filter(name=name).first() or merchant_create(name=name)
                store = Store.objects.filter(merchant=shop).first() or store_create(merchant=shop, name=street)
                tills.append(Terminal.objects.filter(store=store).first() or terminal_create(store=store, name="Till 1"))
        day = first
        while day < today:
            _demo_history_day(day=day, zone=zone, rng=rng, history=history, people=people, tills=tills, staff=staff,
                              asset_code=main_currency, topup=day == first or day.weekday() == 0)
            day += timedelta(days=1)
    say(f"demo history: {history.written} operations from {first} to {today - timedelta(days=1)} ({zone.key})")
    return history.written


def _demo_history_fee_schedule(*, asset_code: str, valid_from: datetime) -> None:
    """The demo's fee from before its history: fee_schedule_create refuses a start in the
    past by design (a process may have cached the schedules), so the demo, before anything
    reads them, writes its schedule row itself, audited, unless one is in force then."""
    if FeeSchedule.objects.filter(asset_id=asset_code, merchant__isnull=True, valid_from__lte=valid_from).exists():
        return
    schedule = FeeSchedule.objects.create(asset_id=asset_code, rate=DEMO_FEE_RATE, valid_from=valid_from)
    audit_record(action="fee_schedule.create", target_type="fee_schedule", target_id=schedule.pk, reason="demo history",
                 after={"asset": asset_code, "merchant": None, "rate": str(DEMO_FEE_RATE), "valid_from": valid_from.isoformat()})
    fee_terms_forget()


def _demo_history_day(
    *, day: date, zone: Any, rng: random.Random, history: _History, people: list[Customer], tills: list[Terminal], staff: StaffMember,
    asset_code: str, topup: bool,
) -> None:
    """One local day: top-ups on Mondays, 3 to 8 payments between 08:00 and 20:00 (never
    the same customer, shop and amount within minutes: that is a duplicate suspect), now and
    then a refund of one of them, and a transfer between friends."""
    def at(minutes: int) -> datetime:
        return datetime.combine(day, time(0), tzinfo=zone) + timedelta(minutes=minutes)

    if topup:
        for n, person in enumerate(people):
            with time_machine.travel(at(7 * 60 + 30 + n), tick=False):
                adjustment_create(staff=staff, customer=person, asset_code=asset_code, amount=DEMO_HISTORY_WEEKLY_TOPUP,
                                  direction="credit", reason=DEMO_HISTORY_TOPUP)
            history.move(person.pk, DEMO_HISTORY_WEEKLY_TOPUP)
    slots = sorted(rng.sample(range(8 * 4, 20 * 4), rng.randint(3, 8)))  # quarter hours
    paid: list[tuple[Payment, int]] = []
    for slot in slots:
        person, till, amount = rng.choice(people), rng.choice(tills), rng.choice(DEMO_HISTORY_PRICES)
        if not history.has(person.pk, amount):
            continue
        with time_machine.travel(at(slot * 15 + rng.randint(0, 9)), tick=False):
            # As at the till: the customer shows a one-time QR token (the demo tenant does not
            # let a shop charge a customer by id).
            _, token = payment_token_create(customer=person)
            payment = payment_create_with_token(terminal=till, customer_token=token, asset_code=asset_code, amount=amount)
        history.move(person.pk, -amount)
        history.move(payment.merchant_id, amount - payment.fee)
        paid.append((payment, slot))
    if paid and rng.random() < 0.2:
        payment, slot = rng.choice(paid)
        amount = payment.amount if rng.random() < 0.5 else payment.amount // 2
        if history.has(payment.merchant_id, amount):
            with time_machine.travel(at(slot * 15 + 12), tick=False):
                refund = refund_create(payment=payment, amount=amount, reason="demo: returned goods")
            history.move(payment.merchant_id, -(amount - refund.fee))
            history.move(payment.customer_id or "", amount)
    if rng.random() < 0.3:
        giver, taker = rng.sample(people, 2)
        amount = rng.choice((500, 1000, 2000))
        if history.has(giver.pk, amount):
            with time_machine.travel(at(21 * 60 + rng.randint(0, 59)), tick=False):
                transfer_create(from_customer=giver, to_customer=taker, asset_code=asset_code, amount=amount)
            history.move(giver.pk, -amount)
            history.move(taker.pk, amount)


def demo_reconciliation_ensure() -> ReconciliationRun | None:
    """Run reconciliation once (the service, in this process) when the demo tenant has no
    finished run, so the dashboard shows one at first look."""
    if ReconciliationRun.objects.filter(status__in=[RunStatus.CLEAN, RunStatus.FINDINGS]).exists():
        return None
    run = reconciliation_run_request(trigger=RunTrigger.COMMAND, requested_by="demo seed")
    return reconciliation_run_execute(run_id=run.pk)


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


def demo_psp_ensure(*, psp_url: str, webhook_url: str, state_file: Path, merchant_id: str) -> dict[str, str]:
    """`make run`: make the PSP simulator the demo tenant's card gateway, holding the demo
    merchant's bank account. Its API key, webhook secret and that account are kept in
    `state_file` (0600), which the simulator reads at start (it is not running yet) to know
    where to send the demo tenant's signed webhooks and which bank account it holds."""
    saved: dict[str, Any] = json.loads(state_file.read_text()) if state_file.exists() else {}
    api_key = str(saved.get("api_key") or f"sk_sim_{random_token(16)}")
    secret = str(saved.get("webhook_secret") or f"whsec_{random_token(24)}")
    with schema_context(DEMO_SCHEMA):
        gateway_account_set(gateway="simulator", api_base=psp_url, secret_key=api_key, webhook_secrets=[secret])
        _demo_payouts_ensure(merchant=Merchant.objects.get(pk=merchant_id))
    state_file.write_text(json.dumps({
        "api_key": api_key, "webhook_secret": secret, api_key: [{"url": webhook_url, "secret": secret}],
        "bank_accounts": {api_key: [{"id": DEMO_BANK_ACCOUNT, "token": "btok_bank"}]},
    }))
    state_file.chmod(0o600)
    return {"api_key": api_key, "webhook_url": webhook_url}


def _demo_payouts_ensure(*, merchant: Merchant) -> None:
    """The demo merchant is paid out daily to its bank account at the simulator, and starts
    with an opening balance posted three days back (past the settlement delay: available),
    so beat's first scheduled run pays it out and a newcomer sees the payout reach `paid`
    and its webhook arrive. Both once."""
    staff = staff_member_get_or_create(username="admin")
    if not MerchantBankAccount.objects.filter(merchant=merchant, psp_reference=DEMO_BANK_ACCOUNT).exists():
        bank_account_save(merchant=merchant, gateway="simulator", psp_reference=DEMO_BANK_ACCOUNT, last4="6789", staff=staff)
        # An account the demo has held for long: its payouts need no approval (one changed this week would).
        MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=30))
    if merchant.payout_schedule != "daily":
        merchant_payout_schedule_set(merchant=merchant, schedule="daily")
    if Adjustment.objects.filter(merchant=merchant, reason=DEMO_FUNDING_REASON).exists():
        return
    main_currency = Asset.objects.get(is_main=True).code
    opened = timezone.now() - timedelta(days=3)
    with transaction.atomic():
        adjustment = Adjustment(staff=staff, merchant=merchant, asset_id=main_currency, amount=DEMO_MERCHANT_OPENING, direction="credit",
                                reason=DEMO_FUNDING_REASON)
        legs = [Leg(account_of(party=merchant), main_currency, DEMO_MERCHANT_OPENING),
                Leg(system_account_get(role=SystemRole.ADJUSTMENTS), main_currency, -DEMO_MERCHANT_OPENING)]
        adjustment.ledger_transaction = ledger_post(kind=LedgerTransactionKind.ADJUSTMENT, reference=adjustment.id, legs=legs, created=opened)
        adjustment.save(force_insert=True)
        Adjustment.objects.filter(pk=adjustment.pk).update(created=opened)


# The demo merchant's webhook endpoint, pointed at the local receiver the Procfile starts
# (devtools/webhook_receiver.py). The secret, shown once, is kept in var/ for the receiver;
# a later run reuses it, or rotates it when it is gone or another database's. Whatever
# state the demo data is in (an API run or schemathesis may have filled the merchant's
# endpoints, repointed or disabled the demo's), seeding repairs it and says what it did:
# it never stops `make run`.

DEMO_DESCRIPTION = "make run demo receiver"


def demo_webhook_endpoint_ensure(
    *, merchant_id: str, url: str, state_file: Path, schema: str = DEMO_SCHEMA, say: Callable[[str], None] = print
) -> dict[str, str]:
    """The demo merchant's endpoint at `url`, enabled, for every event, and its secret:
    {"endpoint": id, "secret": whsec_...}. `say` reports each repair.

    The endpoint is, in this order: one already at `url` (the one the state file names
    first); else the state file's endpoint, repointed (its URL was changed); else a new
    one, when the merchant has room; else, at the endpoint limit, the oldest endpoint the
    demo made, or failing that the merchant's oldest, repointed at `url`."""
    saved = _saved_state(state_file=state_file, say=say)
    with schema_context(schema), transaction.atomic():
        merchant = Merchant.objects.get(pk=merchant_id)
        endpoint = _demo_endpoint(merchant=merchant, url=url, saved_id=saved.get("endpoint", ""), say=say)
        if endpoint.status != WebhookEndpointStatus.ENABLED:
            endpoint = webhook_endpoint_update(endpoint=endpoint, status=WebhookEndpointStatus.ENABLED)
            say(f"demo webhook endpoint {endpoint.pk}: was disabled, enabled again")
        if sorted(endpoint.enabled_events) != ["*"]:
            endpoint = webhook_endpoint_update(endpoint=endpoint, enabled_events=["*"])
            say(f"demo webhook endpoint {endpoint.pk}: subscribed to every event again")
        if saved.get("endpoint") == endpoint.pk and saved.get("secret") == _stored_secret(endpoint=endpoint, say=say):
            secret = saved["secret"]
        else:
            endpoint, secret = webhook_endpoint_secret_rotate(endpoint=endpoint, overlap=timedelta(0))
    state = {"endpoint": endpoint.pk, "secret": secret}
    state_file.parent.mkdir(exist_ok=True)
    state_file.write_text(json.dumps(state, indent=2))
    state_file.chmod(0o600)
    return state


def _saved_state(*, state_file: Path, say: Callable[[str], None]) -> dict[str, str]:
    """What the last run saved ({} when nothing usable: the secret is then rotated)."""
    if not state_file.exists():
        return {}
    try:
        saved = json.loads(state_file.read_text())
    except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
        saved = None
    if not isinstance(saved, dict):
        say(f"{state_file}: unreadable, made anew (the demo endpoint gets a new secret)")
        return {}
    return {k: v for k, v in saved.items() if isinstance(v, str)}


def _stored_secret(*, endpoint: WebhookEndpoint, say: Callable[[str], None]) -> str | None:
    """The endpoint's current secret, or None if it no longer opens (the sealing keys
    changed: var/sealing_keys deleted, TALLY_SEALING_KEYS changed): it is then rotated."""
    try:
        return webhook_endpoint_secrets(endpoint=endpoint).current
    except (*UNOPENED, WebhookSecretUnavailable) as exc:
        say(f"demo webhook endpoint {endpoint.pk}: its secret does not open under the current sealing keys "
            f"({type(exc).__name__}); it gets a new one")
        return None


def _demo_endpoint(*, merchant: Merchant, url: str, saved_id: str, say: Callable[[str], None]) -> WebhookEndpoint:
    """The endpoint the demo receiver gets (see demo_webhook_endpoint_ensure), its URL `url`."""
    endpoints = WebhookEndpoint.objects.filter(merchant=merchant)
    at_url = sorted(endpoints.filter(url=url), key=lambda e: (e.pk != saved_id, e.status != WebhookEndpointStatus.ENABLED, e.created))
    if at_url:
        return at_url[0]
    saved = endpoints.filter(pk=saved_id).first() if saved_id else None
    if saved is None:
        try:
            endpoint, _ = webhook_endpoint_create(merchant=merchant, url=url, enabled_events=["*"], description=DEMO_DESCRIPTION)
            return endpoint
        except WebhookEndpointLimitReached:
            pass  # the merchant's endpoints are all taken (an API or fuzzing run): reuse one
        saved = (
            endpoints.filter(description=DEMO_DESCRIPTION).order_by("created", "id").first()
            or endpoints.order_by("created", "id").first()
        )
        assert saved is not None  # at the limit, the merchant has endpoints
    say(f"demo webhook endpoint {saved.pk}: pointed at {url} again (it was {saved.url})")
    return webhook_endpoint_update(endpoint=saved, url=url, enabled_events=["*"])

