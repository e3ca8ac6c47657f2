"""What the payout tests share (their fixtures, `payouts_world`, are in tests/conftest.py): a
tenant of their own with committed data (its recovery and scheduled runs see only payout
tests' rows), the real PSP simulator as its gateway, funded merchants with a bank account
at it, and the simulator's signed payout webhooks carried to the tenant's webhook URL in
process."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from payments.models import MerchantBankAccount, OutboxEvent, Payout
from payments.services.payouts import bank_account_attach
from tests.psp_sim import Simulator
from tests.receivers import Receiver
from wallets.models import Balance, LedgerTransaction, Merchant, StaffMember, SystemRole
from wallets.selectors import account_balance, account_of, movement_accounts_get
from wallets.services.ledger import Leg, ledger_post
from wallets.services.principals import merchant_create

PAYOUTS_TENANT = {"schema_name": "test_payouts", "domain": "payouts.test.localhost", "name": "Payouts", "main_currency": "JPY"}
WEBHOOK_SECRET = "whsec_payouts_1"


@dataclass
class World:
    sim: Simulator
    psp_key: str
    staff: StaffMember
    receiver: Receiver | None = None
    relayed: set[int] = field(default_factory=set)

    def merchant(self, *, funds: int = 10_000, token: str = "btok_bank", recent_funds: int = 0) -> Merchant:
        """A merchant with `funds` available (credited days ago), `recent_funds` pending
        (credited now), and a bank account at the simulator changed 8 days ago."""
        merchant = merchant_create(name=f"Payee {uuid.uuid4().hex[:8]}")
        if funds:
            fund(merchant, funds, days_ago=3)
        if recent_funds:
            fund(merchant, recent_funds, days_ago=0)
        if token:
            bank_account_attach(merchant=merchant, token=token, staff=self.staff)
            MerchantBankAccount.objects.filter(merchant=merchant).update(changed_at=timezone.now() - timedelta(days=8))
        return merchant

    def webhooks_relay(self, *, expect: int = 1) -> list[Any]:
        """Carry the simulator's signed webhooks (as it sent them to the receiver, once at
        least `expect` new ones arrived) to the tenant's webhook URL; the answers."""
        assert self.receiver is not None
        deadline = time.monotonic() + 10
        while len(self.receiver.requests) - len(self.relayed) < expect:
            assert time.monotonic() < deadline, "the simulator's webhooks did not arrive"
            time.sleep(0.05)
        client = Client(HTTP_HOST=PAYOUTS_TENANT["domain"])
        answers = []
        for index, received in enumerate(list(self.receiver.requests)):
            if index in self.relayed:
                continue
            self.relayed.add(index)
            answers.append(client.post("/v1/psp/webhooks/simulator", data=received.body, content_type="application/json",
                                       HTTP_PSP_SIGNATURE=received.headers["Psp-Signature"]))
        connection.set_schema(PAYOUTS_TENANT["schema_name"])
        return answers


def fund(merchant: Merchant, amount: int, *, days_ago: int) -> None:
    """Credit the merchant from the adjustments account, dated `days_ago` (older than the
    settlement delay: available; today: pending)."""
    accounts = movement_accounts_get(customer_id=None, merchant_id=merchant.pk, system_roles=(SystemRole.ADJUSTMENTS,))
    assert accounts.merchant is not None
    with transaction.atomic():
        ledger_post(
            kind="adjustment", reference=f"adj_test_{uuid.uuid4().hex[:12]}", created=timezone.now() - timedelta(days=days_ago),
            legs=[Leg(accounts.system_account(SystemRole.ADJUSTMENTS), "JPY", -amount), Leg(accounts.merchant, "JPY", amount)],
        )


def balance(merchant: Merchant) -> int:
    return account_balance(account=account_of(party=merchant), asset_code="JPY")[0]


def system_balance(role: SystemRole) -> int:
    return int(Balance.objects.filter(account__system_role=role, asset_id="JPY").aggregate(s=Sum("balance"))["s"] or 0)


def ledger_kinds(payout: Payout) -> list[str]:
    return list(LedgerTransaction.objects.filter(reference=payout.pk).order_by("created", "id").values_list("kind", flat=True))


def events(payout: Payout) -> list[tuple[str, int, str]]:
    return [(e.topic, e.sequence, e.payload["status"]) for e in OutboxEvent.objects.filter(object_id=payout.pk).order_by("sequence")]
