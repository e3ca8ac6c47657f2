"""The back office: the tenant admin for every model, money in the asset's
units, staff actions (confirmation, own idempotency key, same services as the API),
roles, maker-checker, login throttling and the append-only audit log."""

from __future__ import annotations

import json
import re
import threading
import uuid
from typing import Any

import pytest
from django.contrib import admin as django_admin
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from devtools.demo_seed import staff_login_ensure
from payments.models import Payment, PendingAdjustment, Refund
from payments.services.approvals import adjustment_request, pending_adjustment_approve
from tenants.models import Tenant
from tests.api.conftest import Api, World
from tests.conftest import TENANT_A, run_in_thread_tenant
from wallets.models import Account, ApiKey, AuditEntry, Balance, LedgerEntry
from wallets.money import money_format
from wallets.services.roles import staff_roles_ensure

PASSWORD = "pw-backoffice-123"


def q(object_id: str) -> str:
    """An id as the admin puts it in URLs (`_` is its escape character)."""
    return quote(object_id)


def _login(username: str, *, role: str | None = None, superuser: bool = False) -> Client:
    staff_login_ensure(username=username, password=PASSWORD, role=role, superuser=superuser)
    client = Client(HTTP_HOST=TENANT_A["domain"], REMOTE_ADDR="203.0.113.7")
    assert client.login(username=username, password=PASSWORD)
    return client


def _pay(api: Api, world: World, amount: int = 1000) -> dict[str, Any]:
    from tests.api.test_money_endpoints import fund

    fund(world, world.customer.obj, amount)
    r = api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": amount})
    assert r.status_code == 201, r.content
    return dict(r.json())


def _confirm_key(page: Any) -> str:
    match = re.search(rb'name="idempotency_key" value="([0-9a-f]+)"', page.content)
    assert match, page.content[:2000]
    return match.group(1).decode()


# --- money in the asset's units ---------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "code", "kind", "exponent", "shown"),
    [
        (1200, "JPY", "currency", 0, "¥1,200"),
        (1250, "EUR", "currency", 2, "12.50 EUR"),
        (5, "EUR", "regional", 2, "0.05 EUR"),
        (340, "POINT", "points", 0, "340 pt"),
        (1200, "CARBON", "carbon", 0, "1.2 kg CO₂"),
        (999, "CARBON", "carbon", 0, "999 g CO₂"),
        (-1234567, "EUR", "currency", 2, "-12,345.67 EUR"),
    ],
)
def test_money_is_shown_in_the_assets_units(amount: int, code: str, kind: str, exponent: int, shown: str) -> None:
    assert money_format(amount=amount, code=code, kind=kind, exponent=exponent) == shown


# --- every model has an admin page that renders ------------------------------------------


# Models shown inside another page rather than on a list of their own, and why.
NOT_ON_A_LIST_OF_THEIR_OWN = {
    "wallets.balance": "shards summed on the account and customer pages",
    "wallets.customerlegacycontact": "the plaintext columns a staged migration drops; shown masked on the customer",
    "webhooks.webhookdeliveryattempt": "the attempts inline on their delivery",
}
TENANT_APPS_WITH_ADMIN = ("wallets", "payments", "idempotency", "webhooks", "reconciliation")


def test_every_tenant_model_has_a_list_and_a_page(api: Api, world: World, tenant: Tenant) -> None:
    from django.apps import apps

    registered = {m._meta.label_lower for m in django_admin.site._registry}
    models = {m._meta.label_lower for m in apps.get_models() if m._meta.app_label in TENANT_APPS_WITH_ADMIN}
    assert sorted(models - registered - set(NOT_ON_A_LIST_OF_THEIR_OWN)) == []  # every model an operator works with
    paid = _pay(api, world, 700)
    client = _login("root-pages", superuser=True)
    for label in sorted(x for x in registered if x.split(".")[0] in (*TENANT_APPS_WITH_ADMIN, "auth", "axes")):
        app, model = label.split(".")
        r = client.get(f"/admin/{app}/{model}/")
        assert r.status_code == 200, (label, r.status_code)
    page = client.get(f"/admin/payments/payment/{q(paid['id'])}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "¥700" in body
    txn = Payment.objects.get(pk=paid["id"]).ledger_transaction_id
    assert f"/admin/wallets/ledgertransaction/{q(txn)}/change/" in body  # a payment links to its ledger transaction
    assert "/admin/payments/outboxevent/?q=" + paid["id"] in body  # ... and to its events
    assert client.get(f"/admin/wallets/ledgertransaction/{q(txn)}/change/").status_code == 200
    customer_page = client.get(f"/admin/wallets/customer/{q(world.customer.id)}/change/").content.decode()
    assert "Freeze wallet" in customer_page and "¥" in customer_page
    merchant_page = client.get(f"/admin/wallets/merchant/{q(world.merchant.id)}/change/").content.decode()
    assert "Adjust balance" in merchant_page and "¥700" in merchant_page  # the payment, in its shards' sum
    key_page = client.get(f"/admin/wallets/apikey/{q(ApiKey.objects.filter(customer=world.customer.obj).first().pk)}/change/")
    assert world.customer.key.encode() not in key_page.content
    assert ApiKey.objects.filter(customer=world.customer.obj).first().key_hash.encode() not in key_page.content
    events = client.get("/admin/payments/outboxevent/", {"q": paid["id"]}).content.decode()
    assert "payment.succeeded" in events


def test_big_lists_never_count_the_whole_table(api: Api, world: World, tenant: Tenant) -> None:
    _pay(api, world, 300)
    client = _login("root-count", superuser=True)
    for path in ("/admin/payments/payment/", "/admin/wallets/ledgerentry/", "/admin/payments/payment/?created__year=2026"):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path).status_code == 200
        counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        for sql in counts:  # only bounded counts: COUNT over a LIMITed subquery
            assert "LIMIT" in sql.upper(), sql


def test_search_by_id_is_an_exact_lookup(api: Api, world: World, tenant: Tenant) -> None:
    paid = _pay(api, world, 300)
    client = _login("root-search", superuser=True)
    with CaptureQueriesContext(connection) as queries:
        r = client.get("/admin/payments/payment/", {"q": paid["id"]})
    assert paid["id"].encode() in r.content
    listing = [q["sql"] for q in queries.captured_queries if "payments_payment" in q["sql"] and "ORDER BY" in q["sql"]]
    assert listing and all("UPPER(" not in sql and "LIKE" not in sql for sql in listing)



def test_a_hold_is_found_by_its_intents_id_through_the_intent(api: Api, world: World, tenant: Tenant) -> None:
    """The hold's own reference has no index (nothing else looks holds up by it): the
    search goes through the intent's primary key and its unique hold."""
    from payments.services.intents import payment_intent_confirm, payment_intent_create
    from tests.api.test_money_endpoints import fund

    fund(world, world.customer.obj, 100)
    intent = payment_intent_create(merchant=world.merchant.obj, customer=world.customer.obj, asset_code="JPY", amount=5,
                                   capture_method="manual")
    intent = payment_intent_confirm(intent=intent)  # manual capture: confirming authorizes (a hold)
    assert intent.hold_id
    client = _login("root-hold-search", superuser=True)
    with CaptureQueriesContext(connection) as queries:
        r = client.get("/admin/wallets/hold/", {"q": intent.id})
    assert intent.hold_id.encode() in r.content
    listing = [q["sql"] for q in queries.captured_queries if "wallets_hold" in q["sql"] and "ORDER BY" in q["sql"]]
    assert listing and all("payments_paymentintent" in sql and "UPPER(" not in sql for sql in listing)

# --- the audit log ------------------------------------------------------------------------


def test_the_audit_log_refuses_update_delete_and_truncate(tenant: Tenant) -> None:
    from wallets.services.audit import audit_record

    entry = audit_record(action="test.entry", target_type="test", target_id="x1", after={"a": 1})
    for sql in (
        "UPDATE wallets_auditentry SET action = 'forged' WHERE id = %s",
        "DELETE FROM wallets_auditentry WHERE id = %s",
        "TRUNCATE wallets_auditentry",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [entry.pk] if "%s" in sql else [])
    entry.refresh_from_db()
    assert entry.action == "test.entry"


def test_api_key_changes_and_freezes_through_the_api_are_audited(api: Api, world: World, tenant: Tenant) -> None:
    r = api.post("/v1/admin/api_keys", world.staff.key, {"principal_type": "customer", "principal_id": world.customer2.id})
    key_id = r.json()["id"]
    rotated = api.post(f"/v1/admin/api_keys/{key_id}/rotate", world.staff.key, {"overlap_seconds": 60})
    assert rotated.status_code == 201
    revoked = api.post(f"/v1/admin/api_keys/{key_id}/revoke", world.staff.key, {})
    assert revoked.status_code == 200
    frozen = api.post(f"/v1/admin/customers/{world.customer2.id}/freeze", world.staff.key, {"reason": "card stolen"})
    assert frozen.status_code == 200
    entries = list(AuditEntry.objects.filter(target_id__in=[key_id, world.customer2.id]).order_by("id"))
    assert [e.action for e in entries] == ["api_key.create", "api_key.rotate", "api_key.revoke", "wallet.freeze"]
    for entry, response in zip(entries, (r, rotated, revoked, frozen), strict=True):
        assert entry.actor == f"staff:{world.staff.id} key {world.staff.key[:7]}"
        assert entry.via == "api" and entry.ip == "127.0.0.1"
        assert entry.request_id == response["Request-Id"]
    assert entries[2].before["revoked_at"] is None and entries[2].after["revoked_at"] is not None
    assert entries[3].before["frozen"] is False and entries[3].after["frozen"] is True and entries[3].reason == "card stolen"
    dumped = json.dumps([e.before for e in entries] + [e.after for e in entries])
    assert "key_hash" not in dumped and rotated.json()["key"] not in dumped  # never a secret


def test_idempotency_mode_switch_is_audited_and_acts_once(tenant: Tenant) -> None:
    client = _login("ops-modes", role="operator")
    page = client.get("/admin/idempotency/idempotencyrecord/modes/")
    assert page.status_code == 200
    form = {"idempotency_key": _confirm_key(page), "face": "terminal", "mode": "optional", "reason": "rollout step 1"}
    assert client.post("/admin/idempotency/idempotencyrecord/modes/", form).status_code == 302
    assert client.post("/admin/idempotency/idempotencyrecord/modes/", form).status_code == 302  # double click
    assert Tenant.objects.get(pk=tenant.pk).idempotency_terminal == "optional"
    entries = list(AuditEntry.objects.filter(action="idempotency.mode_set"))
    assert len(entries) == 1
    assert entries[0].before == {"face": "terminal", "mode": "mandatory"} and entries[0].after["mode"] == "optional"
    assert entries[0].actor == "user:ops-modes" and entries[0].via == "admin" and entries[0].ip == "203.0.113.7"
    assert viewer_cannot(client=_login("viewer-modes", role="viewer"), path="/admin/idempotency/idempotencyrecord/modes/")


def viewer_cannot(*, client: Client, path: str) -> bool:
    return bool(client.get(path).status_code == 403)


# --- staff refunds: the API's service, once per confirmation ---------------------------------


def _entries_shape(txn_id: str) -> list[tuple[str, str, int]]:
    return sorted(
        (e.account.kind + ":" + (e.account.system_role or ("customer" if e.account.customer_id else "merchant")), e.asset_id, e.amount)
        for e in LedgerEntry.objects.filter(transaction_id=txn_id).select_related("account")
    )


def test_a_staff_refund_writes_the_same_ledger_as_the_apis(api: Api, world: World, tenant: Tenant) -> None:
    by_api, by_admin = _pay(api, world, 1000), _pay(api, world, 1000)
    r = api.post("/v1/merchant/refunds", world.merchant.key, {"payment": by_api["id"], "amount": 400})
    assert r.status_code == 201
    client = _login("fin-refund", role="finance")
    page = client.get(f"/admin/payments/payment/{q(by_admin['id'])}/act/refund/")
    assert page.status_code == 200
    done = client.post(f"/admin/payments/payment/{q(by_admin['id'])}/act/refund/", {
        "idempotency_key": _confirm_key(page), "amount": 400, "reason": "customer complaint",
    })
    assert done.status_code == 302, done.content[:3000]
    api_refund = Refund.objects.get(payment_id=by_api["id"])
    admin_refund = Refund.objects.get(payment_id=by_admin["id"])
    assert _entries_shape(api_refund.ledger_transaction_id) == _entries_shape(admin_refund.ledger_transaction_id)
    entry = AuditEntry.objects.get(action="admin.refund", target_id=by_admin["id"])
    assert entry.actor == "user:fin-refund" and entry.before["amount_refunded"] == 0 and entry.after["amount_refunded"] == 400
    assert entry.reason == "customer complaint" and admin_refund.pk in entry.after["result"]


def test_a_double_submitted_confirmation_acts_once(api: Api, world: World, tenant: Tenant) -> None:
    paid = _pay(api, world, 1000)
    client = _login("fin-double", role="finance")
    url = f"/admin/payments/payment/{q(paid['id'])}/act/refund/"
    form = {"idempotency_key": _confirm_key(client.get(url)), "amount": 100, "reason": ""}
    first, second = client.post(url, form, follow=True), client.post(url, form, follow=True)
    assert first.status_code == second.status_code == 200
    assert b"Already done" in second.content
    assert Refund.objects.filter(payment_id=paid["id"]).count() == 1
    assert Payment.objects.get(pk=paid["id"]).amount_refunded == 100
    # A new confirmation page is a new key: a second, deliberate refund goes through.
    form2 = {**form, "idempotency_key": _confirm_key(client.get(url))}
    client.post(url, form2)
    assert Refund.objects.filter(payment_id=paid["id"]).count() == 2


def test_two_concurrent_submissions_of_one_confirmation_refund_once(live_tenant: Tenant) -> None:
    from tests.factories import fund
    from wallets.services.principals import api_key_create, customer_create, merchant_create, store_create, terminal_create

    suffix = uuid.uuid4().hex[:8]
    customer = customer_create(name=f"Race {suffix}")
    terminal = terminal_create(store=store_create(merchant=merchant_create(name=f"M {suffix}"), name="S"), name="T")
    fund(customer, 1000)
    _, terminal_key = api_key_create(principal=terminal)
    paid = Api(TENANT_A["domain"]).post("/v1/terminal/payments", terminal_key, {"customer": customer.pk, "asset": "JPY", "amount": 1000})
    payment_id = paid.json()["id"]
    username = f"fin-race-{suffix}"
    staff_login_ensure(username=username, password=PASSWORD, role="finance")
    form = {"idempotency_key": uuid.uuid4().hex, "amount": 250, "reason": "race"}
    statuses: list[int] = []

    def submit() -> None:
        client = Client(HTTP_HOST=TENANT_A["domain"])
        assert client.login(username=username, password=PASSWORD)
        statuses.append(client.post(f"/admin/payments/payment/{q(payment_id)}/act/refund/", form).status_code)

    threads = [threading.Thread(target=run_in_thread_tenant, args=(live_tenant, submit)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) in ([302, 302], [200, 302])  # the loser either replays or is told the key is in use
    assert Refund.objects.filter(payment_id=payment_id).count() == 1
    assert Payment.objects.get(pk=payment_id).amount_refunded == 250


# --- roles and maker-checker -------------------------------------------------------------


def test_roles_are_groups_with_permissions(tenant: Tenant) -> None:
    groups = staff_roles_ensure()
    assert set(groups) == {"viewer", "operator", "finance"}
    viewer, operator, finance = (staff_login_ensure(username=f"r-{r}", password=PASSWORD, role=r).user for r in ("viewer", "operator", "finance"))
    assert viewer.has_perm("payments.view_payment") and not viewer.has_perm("payments.refund_payment")
    assert not viewer.has_perm("wallets.freeze_account") and not viewer.has_perm("payments.change_payment")
    assert operator.has_perm("wallets.freeze_account") and operator.has_perm("wallets.manage_apikey")
    assert operator.has_perm("webhooks.redeliver_webhookdelivery") and not operator.has_perm("payments.approve_pendingadjustment")
    assert finance.has_perm("payments.approve_pendingadjustment") and finance.has_perm("payments.refund_payment")
    assert not finance.has_perm("wallets.freeze_account")


def test_each_role_sees_only_its_actions(api: Api, world: World, tenant: Tenant) -> None:
    paid = _pay(api, world, 500)
    viewer, operator = _login("v-act", role="viewer"), _login("o-act", role="operator")
    assert viewer.get(f"/admin/payments/payment/{q(paid['id'])}/change/").status_code == 200
    assert b"act/refund" not in viewer.get(f"/admin/payments/payment/{q(paid['id'])}/change/").content
    assert viewer.get(f"/admin/payments/payment/{q(paid['id'])}/act/refund/").status_code == 403
    assert viewer.post(f"/admin/payments/payment/{q(paid['id'])}/act/refund/", {"idempotency_key": "k1", "amount": 1}).status_code == 403
    assert viewer.get(f"/admin/wallets/customer/{q(world.customer.id)}/act/freeze/").status_code == 403
    assert Payment.objects.get(pk=paid["id"]).amount_refunded == 0
    page = operator.get(f"/admin/wallets/customer/{q(world.customer.id)}/act/freeze/")
    assert page.status_code == 200
    r = operator.post(f"/admin/wallets/customer/{q(world.customer.id)}/act/freeze/", {"idempotency_key": _confirm_key(page), "reason": "fraud"})
    assert r.status_code == 302
    assert Account.objects.get(customer_id=world.customer.id).frozen
    assert Balance.objects.filter(account__customer_id=world.customer.id, frozen=False).count() == 0
    assert AuditEntry.objects.get(action="wallet.freeze", target_id=world.customer.id).actor == "user:o-act"
    assert operator.get(f"/admin/wallets/customer/{q(world.customer.id)}/act/adjust/").status_code == 403  # finance only


def test_maker_checker_above_the_threshold(world: World, tenant: Tenant) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings={"adjustment_approval_threshold": 1000})
    connection.set_tenant(Tenant.objects.get(pk=tenant.pk))
    maker = staff_login_ensure(username="fin-maker", password=PASSWORD, role="finance")
    checker = staff_login_ensure(username="fin-checker", password=PASSWORD, role="finance")
    small = adjustment_request(maker=maker, customer=world.customer.obj, asset_code="JPY", amount=1000, direction="credit", reason="ok")
    assert not isinstance(small, PendingAdjustment)  # at the threshold: posted at once
    account = Account.objects.get(customer_id=world.customer.id)
    before = sum(b.balance for b in Balance.objects.filter(account=account, asset_id="JPY"))

    maker_client = _login("fin-maker", role="finance")
    page = maker_client.get(f"/admin/wallets/customer/{q(world.customer.id)}/act/adjust/")
    r = maker_client.post(f"/admin/wallets/customer/{q(world.customer.id)}/act/adjust/", {
        "idempotency_key": _confirm_key(page), "asset": "JPY", "amount": 5000, "direction": "credit", "reason": "goodwill",
    }, follow=True)
    assert b"waiting for a second staff member" in r.content
    pending = PendingAdjustment.objects.get(maker=maker)
    assert pending.status == "pending" and sum(b.balance for b in Balance.objects.filter(account=account, asset_id="JPY")) == before

    # The maker cannot approve their own proposal, from the admin or the service.
    page = maker_client.get(f"/admin/payments/pendingadjustment/{q(pending.pk)}/act/approve/")
    r = maker_client.post(f"/admin/payments/pendingadjustment/{q(pending.pk)}/act/approve/", {"idempotency_key": _confirm_key(page)})
    assert r.status_code == 200 and b"different staff member" in r.content
    from payments.errors import ApproverIsMaker

    with pytest.raises(ApproverIsMaker):
        pending_adjustment_approve(pending=pending, checker=maker)
    assert PendingAdjustment.objects.get(pk=pending.pk).status == "pending"

    checker_client = _login("fin-checker", role="finance")
    page = checker_client.get(f"/admin/payments/pendingadjustment/{q(pending.pk)}/act/approve/")
    r = checker_client.post(f"/admin/payments/pendingadjustment/{q(pending.pk)}/act/approve/", {"idempotency_key": _confirm_key(page)})
    assert r.status_code == 302
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.checker_id == checker.pk and pending.adjustment is not None
    assert pending.adjustment.staff_id == maker.pk and pending.adjustment.amount == 5000
    assert sum(b.balance for b in Balance.objects.filter(account=account, asset_id="JPY")) == before + 5000
    actions = list(AuditEntry.objects.filter(target_id=pending.pk).values_list("action", "actor").order_by("id"))
    assert actions == [("adjustment.propose", "user:fin-maker"), ("adjustment.approve", "user:fin-checker")]


# --- logins ------------------------------------------------------------------------------


def test_admin_login_is_throttled_by_axes(tenant: Tenant) -> None:
    staff_login_ensure(username="locked-out", password=PASSWORD, role="viewer")
    client = Client(HTTP_HOST=TENANT_A["domain"], REMOTE_ADDR="198.51.100.9")
    for _ in range(4):
        r = client.post("/admin/login/?next=/admin/", {"username": "locked-out", "password": "wrong"})
        assert r.status_code == 200  # the login form again
    r = client.post("/admin/login/?next=/admin/", {"username": "locked-out", "password": "wrong"})
    assert r.status_code == 429  # the 5th failure locks (username, address) out
    r = client.post("/admin/login/?next=/admin/", {"username": "locked-out", "password": PASSWORD})
    assert r.status_code == 429  # axes' lockout answer: even the right password is refused
    other_address = Client(HTTP_HOST=TENANT_A["domain"], REMOTE_ADDR="198.51.100.10")
    assert other_address.post("/admin/login/?next=/admin/", {"username": "locked-out", "password": PASSWORD}).status_code == 302


def test_the_platform_superuser_is_not_a_tenant_login(tenant_a: Tenant, db: None) -> None:
    connection.set_schema_to_public()
    get_user_model().objects.create_superuser(username="platform-only", password=PASSWORD)
    public = Client(HTTP_HOST="public.test.localhost")
    assert public.post("/admin/login/?next=/admin/", {"username": "platform-only", "password": PASSWORD}).status_code == 302
    tenant_client = Client(HTTP_HOST=TENANT_A["domain"])
    r = tenant_client.post("/admin/login/?next=/admin/", {"username": "platform-only", "password": PASSWORD})
    assert r.status_code == 200 and b"Please enter the correct username" in r.content


def test_roles_command_repairs_a_tenants_groups(tenant: Tenant) -> None:
    from io import StringIO

    from django.contrib.auth.models import Group
    from django.core.management import call_command

    Group.objects.filter(name="operator").delete()
    out = StringIO()
    call_command("staff_roles_ensure", "--tenant", tenant.schema_name, stdout=out)
    assert f"{tenant.schema_name}: finance, operator, viewer" in out.getvalue()
    assert Group.objects.get(name="operator").permissions.filter(codename="freeze_account").exists()


def test_rotating_a_key_in_the_admin_shows_it_once_and_stores_it_sealed(world: World, tenant: Tenant) -> None:
    from idempotency.models import IdempotencyRecord

    old = ApiKey.objects.filter(terminal=world.terminal.obj).first()
    client = _login("ops-rotate", role="operator")
    url = f"/admin/wallets/apikey/{q(old.pk)}/act/rotate/"
    form = {"idempotency_key": _confirm_key(client.get(url)), "overlap_seconds": 60}
    first = client.post(url, form)
    assert first.status_code == 200
    raw = re.search(rb'<pre id="secret-shown-once">([^<]+)</pre>', first.content).group(1).decode()
    assert raw.startswith("tk_") and ApiKey.objects.filter(terminal=world.terminal.obj).count() == 2
    again = client.post(url, form)  # a double submission: the same key again, nothing minted
    assert raw.encode() in again.content and b"Already done" in again.content
    assert ApiKey.objects.filter(terminal=world.terminal.obj).count() == 2
    record = IdempotencyRecord.objects.get(principal_id=f"user:{get_user_model().objects.get(username='ops-rotate').pk}")
    assert raw.encode() not in bytes(record.response_body)  # sealed, as the API's secret-bearing responses
    entry = AuditEntry.objects.get(action="api_key.rotate", target_id=old.pk)
    assert entry.actor == "user:ops-rotate" and raw not in json.dumps(entry.after)
    r = Api(TENANT_A["domain"]).get("/v1/terminal/payments", raw)
    assert r.status_code == 200  # the key shown works


def test_a_refused_confirmation_does_nothing_and_can_be_corrected(api: Api, world: World, tenant: Tenant) -> None:
    paid = _pay(api, world, 1000)
    client = _login("fin-refused", role="finance")
    url = f"/admin/payments/payment/{q(paid['id'])}/act/refund/"
    key = _confirm_key(client.get(url))
    refused = client.post(url, {"idempotency_key": key, "amount": 5000, "reason": ""})
    assert refused.status_code == 200 and b"exceeds what is left to refund" in refused.content
    assert Refund.objects.filter(payment_id=paid["id"]).count() == 0 and not AuditEntry.objects.filter(target_id=paid["id"]).exists()
    fresh = _confirm_key(refused)
    assert fresh != key  # the corrected form acts under a key of its own
    assert client.post(url, {"idempotency_key": fresh, "amount": 600, "reason": ""}).status_code == 302
    assert Payment.objects.get(pk=paid["id"]).amount_refunded == 600


def test_an_api_key_cannot_bypass_maker_checker(api: Api, world: World, tenant: Tenant) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings={"adjustment_approval_threshold": 1000})
    body = {"customer": world.customer.id, "asset": "JPY", "amount": 1001, "direction": "credit", "reason": "big goodwill"}
    r = api.post("/v1/admin/adjustments", world.staff.key, body)
    assert r.status_code == 202, r.content
    assert r.json()["object"] == "pending_adjustment" and r.json()["status"] == "pending" and r.json()["adjustment"] is None
    assert not LedgerEntry.objects.filter(account__customer_id=world.customer.id).exists()
    assert api.post("/v1/admin/adjustments", world.staff.key, {**body, "amount": 1000}).status_code == 201


def test_a_lowered_maker_checker_threshold_holds_at_once_in_a_process_whose_tenant_is_cached(
    api: Api, world: World, tenant: Tenant, settings: Any
) -> None:
    from tenants.middleware import tenant_cache_clear

    settings.TENANT_CACHE_SECONDS = 60.0  # as in production: this process keeps the tenant it resolved
    tenant_cache_clear()
    body = {"customer": world.customer.id, "asset": "JPY", "amount": 1001, "direction": "credit", "reason": "goodwill"}
    assert api.post("/v1/admin/adjustments", world.staff.key, body).status_code == 201  # default threshold: alone
    # Another process lowers the threshold: this process's tenant cache is not told.
    Tenant.objects.filter(pk=tenant.pk).update(extra_settings={"adjustment_approval_threshold": 1000})
    r = api.post("/v1/admin/adjustments", world.staff.key, {**body, "amount": 5})
    assert r.status_code == 202, r.content  # 1001 + 5 posted alone in the window: over the new threshold
    tenant_cache_clear()
