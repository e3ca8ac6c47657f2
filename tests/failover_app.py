"""The failover test's steps that run against its own PostgreSQL pair, each in a process of
its own (the test process's Django is bound to the shared test database):

    python -m tests.failover_app seed KEYS_FILE N the demo tenant, as `make run` seeds it, and N
                                                   funded customers with a mandate for its merchant
    python -m tests.failover_app check [SEEDED]   payments (of the seeded customers), events as JSON

DATABASE_URL names the pair (libpq's multi-host form)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    import django

    django.setup()
    from django_tenants.utils import schema_context

    from devtools.demo_seed import DEMO_SCHEMA, demo_seed

    if argv[0] == "seed":
        from payments.services.adjustments import adjustment_create
        from payments.services.mandates import mandate_grant
        from wallets.models import Merchant
        from wallets.services.principals import customer_create, staff_member_get_or_create

        seeded = demo_seed(keys_file=Path(argv[1]))
        customers = []
        # Payments differ by customer and amount: reconciliation's duplicate-charge check
        # flags one customer paying one merchant the same amount twice within minutes.
        with schema_context(DEMO_SCHEMA):
            merchant = Merchant.objects.get(pk=seeded["ids"]["merchant"])
            staff = staff_member_get_or_create(username="admin")
            for n in range(int(argv[2])):
                customer = customer_create(name=f"Failover {n}")
                adjustment_create(staff=staff, customer=customer, asset_code="JPY", amount=50_000, direction="credit", reason="failover test")
                mandate_grant(customer=customer, merchant=merchant)
                customers.append(customer.pk)
        print(json.dumps({"keys": seeded["keys"], "customers": customers}))
    elif argv[0] == "check":
        from payments.models import OutboxEvent, Payment

        # With a customers file (the seed's output), only those customers' payments: the
        # demo schema may hold an earlier test's payments in a shared test database.
        customers = json.loads(Path(argv[1]).read_text())["customers"] if len(argv) > 1 else None
        with schema_context(DEMO_SCHEMA):
            payments = Payment.objects.all() if customers is None else Payment.objects.filter(customer_id__in=customers)
            print(json.dumps({
                "payments": sorted(payments.values_list("id", flat=True)),
                "events_unpublished": OutboxEvent.objects.filter(published_at__isnull=True).count(),
            }))
    else:
        raise SystemExit(f"unknown step {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
