"""Where a payment's time goes, in one process, one payment at a time.

    .venv/bin/python bench/bench_payment_cpu.py --payments 500

On bench_ledger's database (set up the same way): the wall time and the Python CPU time
(time.process_time) per payment through payment_create, the CPU split by phase (the
locking select, the balance update, the other writes), the SQL statements per payment,
and two references measured in the same process: an ORM `filter(pk=).first()` and a raw
cursor `SELECT 1`.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _per_call(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of fn."""
    fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - cpu) / n * 1000, (time.perf_counter() - wall) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--payments", type=int, default=500)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench")
    args = parser.parse_args()

    from bench.bench_ledger import _fixtures, _setup

    _setup(args.database_url, limit_set_calls=True)
    fixtures = _fixtures()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import payments.services.charges as charges
    import wallets.locks as locks
    import wallets.services.ledger as ledger
    from wallets.models import Customer

    connection.set_tenant(fixtures["tenant"])
    customers, terminals = fixtures["customers"][:100], fixtures["terminals"][:50]
    phases: dict[str, float] = collections.defaultdict(float)

    def timed(module: Any, name: str, label: str) -> None:
        original = getattr(module, name)

        @functools.wraps(original)
        def wrapper(*a: Any, **k: Any) -> Any:
            started = time.process_time()
            try:
                return original(*a, **k)
            finally:
                phases[label] += time.process_time() - started

        setattr(module, name, wrapper)

    timed(locks, "_locking_select", "locking select (compile, execute, rows)")
    timed(ledger, "_balances_add", "balance update (F() + CASE per row)")
    timed(charges, "ledger_post", "ledger_post (incl. the balance update, transaction, entries)")
    timed(charges, "outbox_event_create", "outbox insert")

    counter = iter(range(10**9))

    def pay() -> None:
        i = next(counter)
        charges.payment_create(terminal=terminals[i % len(terminals)], customer=customers[i % len(customers)], asset_code="JPY", amount=500)

    for _ in range(50):
        pay()
    phases.clear()
    cpu_ms, wall_ms = _per_call(pay, args.payments)
    with CaptureQueriesContext(connection) as queries:
        pay()
    customer_id = customers[0].pk
    orm_cpu, _ = _per_call(lambda: Customer.objects.filter(pk=customer_id).first(), 500)
    cursor = connection.cursor()
    raw_cpu, raw_wall = _per_call(lambda: cursor.execute("SELECT 1"), 2000)
    result = {
        "payments": args.payments,
        "wall_ms_per_payment": round(wall_ms, 2),
        "python_cpu_ms_per_payment": round(cpu_ms, 2),
        "cpu_ms_by_phase": {label: round(total / args.payments * 1000, 2) for label, total in phases.items()},
        "sql_statements_per_payment": len(queries),
        "orm_filter_first_cpu_ms": round(orm_cpu, 3),
        "raw_select_1_cpu_ms": round(raw_cpu, 3),
        "raw_select_1_round_trip_ms": round(raw_wall, 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
