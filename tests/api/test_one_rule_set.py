"""One set of rules: the same payments, refunds and transfers run through the HTTP faces and
through the service modules directly leave identical ledgers.

Two sets of parties in tenant A live through the same story: funded by staff, paying at a
terminal (points and carbon earned), refunded in part (rewards reversed in proportion),
sending money to each other, paying again and refunded in full. The ledgers are compared
with ids replaced by roles (customer, customer2, merchant, system account roles).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from payments.models import Payment
from payments.services.adjustments import adjustment_create
from payments.services.charges import payment_create
from payments.services.refunds import refund_create
from payments.services.transfers import transfer_create
from tests.api.conftest import Api, World, _world
from tests.conftest import TENANT_A
from wallets.models import Account, LedgerEntry


def _through_the_faces(api: Api, world: World) -> None:
    def ok(response: Any, status: int = 201) -> dict[str, Any]:
        assert response.status_code == status, response.content
        return dict(response.json())

    ok(api.post("/v1/admin/adjustments", world.staff.key,
                {"customer": world.customer.id, "asset": "JPY", "amount": 10_000, "direction": "credit", "reason": "opening"}))
    first = ok(api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer.id, "asset": "JPY", "amount": 1_000}))
    ok(api.post("/v1/merchant/refunds", world.merchant.key, {"payment": first["id"], "amount": 400}))
    ok(api.post("/v1/customer/transfers", world.customer.key, {"to_customer": world.customer2.id, "asset": "JPY", "amount": 2_500}))
    second = ok(api.post("/v1/terminal/payments", world.terminal.key, {"customer": world.customer2.id, "asset": "JPY", "amount": 777}))
    ok(api.post("/v1/merchant/refunds", world.merchant.key, {"payment": second["id"], "amount": 777}))
    ok(api.post("/v1/merchant/refunds", world.merchant.key, {"payment": first["id"], "amount": 600}))


def _through_the_services(world: World) -> None:
    customer, customer2, terminal = world.customer.obj, world.customer2.obj, world.terminal.obj
    adjustment_create(staff=world.staff.obj, customer=customer, asset_code="JPY", amount=10_000, direction="credit", reason="opening")
    first = payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=1_000)
    refund_create(payment=first, amount=400)
    transfer_create(from_customer=customer, to_customer=customer2, asset_code="JPY", amount=2_500)
    second = payment_create(terminal=terminal, customer=customer2, asset_code="JPY", amount=777)
    refund_create(payment=second, amount=777)
    refund_create(payment=Payment.objects.get(pk=first.pk), amount=600)


def _ledger_of(world: World) -> tuple[list[tuple[str, list[tuple[str, str, int]]]], dict[tuple[str, str], int], list[tuple[int, ...]]]:
    """(transactions as (kind, sorted entries by role), balance per (role, asset), payments) of one world."""
    parties = {world.customer.id: "customer", world.customer2.id: "customer2", world.merchant.id: "merchant"}
    roles: dict[str, str] = {}
    for account in Account.objects.all():
        owner = account.customer_id or account.merchant_id
        if owner in parties:
            roles[account.id] = parties[owner]
        elif account.system_role:
            roles[account.id] = f"system:{account.system_role}"
    ours = {account_id for account_id, role in roles.items() if not role.startswith("system:")}
    txn_ids = LedgerEntry.objects.filter(account_id__in=ours).values_list("transaction_id", flat=True)
    by_txn: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    kinds: dict[str, tuple[Any, str]] = {}
    for entry in LedgerEntry.objects.filter(transaction_id__in=txn_ids).select_related("transaction").order_by("transaction__created", "id"):
        by_txn[entry.transaction_id].append((roles[entry.account_id], entry.asset_id, entry.amount))
        kinds[entry.transaction_id] = (entry.transaction.created, entry.transaction.kind)
    transactions = [(kinds[t][1], sorted(by_txn[t])) for t in sorted(by_txn, key=lambda t: kinds[t])]
    balances: dict[tuple[str, str], int] = defaultdict(int)
    for role, asset, amount in (e for _, entries in transactions for e in entries):
        if not role.startswith("system:"):
            balances[(role, asset)] += amount
    payments = sorted(
        (p.amount, p.amount_refunded, p.points_earned, p.points_reversed, p.carbon_grams, p.carbon_grams_reversed)
        for p in Payment.objects.filter(customer_id__in=[world.customer.id, world.customer2.id])
    )
    return transactions, dict(balances), payments


def test_faces_and_services_leave_identical_ledgers(api: Api, world: World) -> None:
    _through_the_faces(api, world)
    direct = _world(TENANT_A["domain"], "direct")
    _through_the_services(direct)

    via_faces, via_services = _ledger_of(world), _ledger_of(direct)
    assert via_faces == via_services
    transactions, balances, payments = via_faces
    assert [kind for kind, _ in transactions] == ["adjustment", "payment", "refund", "transfer", "payment", "refund", "refund"]
    # The story earned rewards and reversed them: the comparison covers the reward rules too.
    assert payments == [(777, 777, 7, 7, 388, 388), (1_000, 1_000, 10, 10, 500, 500)]
    assert balances[("customer", "JPY")] == 10_000 - 1_000 + 400 - 2_500 + 600
    assert balances[("merchant", "JPY")] == 0
