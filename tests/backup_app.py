"""The backup test's steps against its own PostgreSQL (tests/pgbackrest_support.py) or the
copy restored from it, each in a process of its own (the test process's Django is bound to
the shared test database); DATABASE_URL names the instance:

    python -m tests.backup_app tenant SCHEMA N   a second tenant, besides the demo one: a merchant and
                                                 N funded customers, each paying it once through the services
    python -m tests.backup_app pay SCHEMA SEEDED N  N payments in that tenant by the customers of SEEDED (the
                                                 failover app's seed output), at the terminal they paid at
    python -m tests.backup_app check SCHEMA      that tenant's payments and ledger size, as JSON"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    import django

    django.setup()
    from django_tenants.utils import schema_context

    from payments.models import Payment
    from wallets.models import LedgerEntry

    schema = argv[1]
    if argv[0] == "tenant":
        from payments.services.adjustments import adjustment_create
        from payments.services.charges import payment_create
        from payments.services.mandates import mandate_grant
        from tenants.services import tenant_create
        from wallets.services.principals import customer_create, merchant_create, staff_member_get_or_create, store_create, terminal_create

        tenant_create(schema_name=schema, domain=f"{schema}.localhost", name=f"Backup test {schema}", main_currency="JPY")
        with schema_context(schema):
            staff = staff_member_get_or_create(username="admin")
            merchant = merchant_create(name="Harbour Kiosk")
            terminal = terminal_create(store=store_create(merchant=merchant, name="Pier"), name="Till 1")
            for n in range(int(argv[2])):
                customer = customer_create(name=f"Backup {n}")
                adjustment_create(staff=staff, customer=customer, asset_code="JPY", amount=10_000, direction="credit", reason="backup test")
                mandate_grant(customer=customer, merchant=merchant)
                # Amounts differ by customer: reconciliation flags a customer paying a merchant
                # the same amount twice within minutes as a possible duplicate charge.
                payment_create(terminal=terminal, customer=customer, asset_code="JPY", amount=100 + n)
    elif argv[0] == "pay":
        from pathlib import Path

        from payments.services.charges import payment_create
        from wallets.models import Customer

        customers = json.loads(Path(argv[2]).read_text())["customers"]
        with schema_context(schema):
            terminal = Payment.objects.filter(customer_id__in=customers).order_by("pk").first().terminal  # type: ignore[union-attr]
            # Amounts no client sent (theirs are small): no duplicate-charge suspects.
            made = [payment_create(terminal=terminal, customer=Customer.objects.get(pk=customers[n % len(customers)]), asset_code="JPY",
                                   amount=9_000 + n).pk for n in range(int(argv[3]))]
        print(json.dumps({"payments": made}))
        return
    elif argv[0] != "check":
        raise SystemExit(f"unknown step {argv[0]!r}")
    with schema_context(schema):
        print(json.dumps({"payments": sorted(Payment.objects.values_list("id", flat=True)), "entries": LedgerEntry.objects.count()}))


if __name__ == "__main__":
    main(sys.argv[1:])
