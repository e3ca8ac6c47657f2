"""Checks on the ledger's data."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.db.models import Count, Sum

from reconciliation.checks.base import CheckContext, Discrepancy, ObjectRef, Severity, rows_stream
from wallets.daily_totals import ACCOUNTS_MIGRATION as ACCOUNT_TOTALS_MIGRATION
from wallets.daily_totals import MIGRATION as DAILY_TOTALS_MIGRATION
from wallets.daily_totals import daily_totals_differences, daily_totals_latest_differences
from wallets.models import Balance, Hold, HoldStatus, LedgerEntry
from wallets.selectors import ledger_orphan_references_iter
from wallets.staged.phases import reads_new, staged_phase


def account_ref(account_id: str) -> ObjectRef:
    return ObjectRef("wallets", "account", account_id)


_BALANCE_VS_ENTRIES_SQL = """
WITH b AS (SELECT account_id, asset_id, SUM(balance) AS total, COUNT(*) AS shards FROM wallets_balance GROUP BY 1, 2),
     e AS (SELECT account_id, asset_id, SUM(amount) AS total, COUNT(*) AS entries FROM wallets_ledgerentry GROUP BY 1, 2),
     d AS (SELECT COALESCE(b.account_id, e.account_id) AS account_id, COALESCE(b.asset_id, e.asset_id) AS asset_id,
                  COALESCE(b.total, 0) AS balance, COALESCE(e.total, 0) AS entries_sum, COALESCE(b.shards, 0) AS shards,
                  COALESCE(e.entries, 0) AS entries
             FROM b FULL OUTER JOIN e ON b.account_id = e.account_id AND b.asset_id = e.asset_id
            WHERE COALESCE(b.total, 0) <> COALESCE(e.total, 0))
SELECT d.account_id, d.asset_id, d.balance, d.entries_sum, d.shards, d.entries, a.kind, a.customer_id, a.merchant_id, a.system_role
  FROM d LEFT JOIN wallets_account a ON a.id = d.account_id
 ORDER BY 1, 2
"""


def _owner_refs(customer: str | None, merchant: str | None) -> tuple[ObjectRef, ...]:
    if customer:
        return (ObjectRef("wallets", "customer", customer),)
    if merchant:
        return (ObjectRef("wallets", "merchant", merchant),)
    return ()


def ledger_balance_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Every (account, asset): its balance shards sum to its ledger entries, and its held part to its active holds."""
    ctx.stats["entries"] = LedgerEntry.objects.count()
    ctx.stats["balance_rows"] = Balance.objects.count()
    rows = rows_stream(_BALANCE_VS_ENTRIES_SQL, chunk_size=ctx.chunk_size)
    for account_id, asset, balance_sum, entries_total, shards, entries, kind, customer, merchant, role in rows:
        balance, entries_sum = int(balance_sum), int(entries_total)  # SUM(bigint) is numeric: exact, as int
        owner = f"{kind}:{role or customer or merchant}" if kind else "no such account"
        yield Discrepancy(
            kind="ledger_balance_mismatch",
            severity=Severity.CRITICAL,
            summary=f"{account_id} ({owner}) {asset}: balance {balance} but its ledger entries sum to {entries_sum} "
            f"(difference {balance - entries_sum:+d})",
            details={"account": account_id, "owner": owner, "asset": asset, "balance": balance, "entries_sum": entries_sum,
                     "difference": balance - entries_sum, "shards": int(shards), "entries": int(entries)},
            refs=(account_ref(str(account_id)), *_owner_refs(customer, merchant)),
        )
    held = Balance.objects.values("account_id", "asset_id").annotate(held=Sum("held")).order_by("account_id", "asset_id").filter(held__gt=0)
    holds = {
        (row["account_id"], row["asset_id"]): int(row["total"])
        for row in Hold.objects.filter(status=HoldStatus.ACTIVE).values("account_id", "asset_id").annotate(total=Sum("amount")).order_by()
    }
    # Active holds are few (open authorizations); the balances with a held part are streamed.
    for row in held.iterator(chunk_size=ctx.chunk_size):
        expected = holds.pop((row["account_id"], row["asset_id"]), 0)
        if int(row["held"]) != expected:
            yield _held_mismatch(row["account_id"], row["asset_id"], int(row["held"]), expected)
    for (account_id, asset), expected in holds.items():
        if expected:
            yield _held_mismatch(account_id, asset, 0, expected)


def _held_mismatch(account_id: str, asset: str, held: int, holds: int) -> Discrepancy:
    return Discrepancy(
        kind="ledger_held_mismatch",
        severity=Severity.CRITICAL,
        summary=f"{account_id} {asset}: {held} held on the balance but active holds total {holds}",
        details={"account": account_id, "asset": asset, "held": held, "active_holds": holds, "difference": held - holds},
        refs=(account_ref(account_id),),
    )


def conservation_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Double entry: every transaction's entries, and every asset's balances, sum to zero per asset."""
    unbalanced = (
        LedgerEntry.objects.order_by().values("transaction_id", "asset_id")
        .annotate(total=Sum("amount"), entries=Count("id")).exclude(total=0).order_by("transaction_id", "asset_id")
    )
    for row in unbalanced.iterator(chunk_size=ctx.chunk_size):
        yield Discrepancy(
            kind="ledger_unbalanced_transaction",
            severity=Severity.CRITICAL,
            summary=f"ledger transaction {row['transaction_id']} does not sum to zero in {row['asset_id']}: {int(row['total']):+d}",
            details={"transaction": row["transaction_id"], "asset": row["asset_id"], "sum": int(row["total"]), "entries": int(row["entries"])},
            refs=(ObjectRef("wallets", "ledgertransaction", str(row["transaction_id"])),),
        )
    totals = Balance.objects.order_by().values("asset_id").annotate(total=Sum("balance")).order_by("asset_id")
    assets = 0
    for total in totals:
        assets += 1
        if int(total["total"] or 0) != 0:
            yield Discrepancy(
                kind="asset_not_conserved",
                severity=Severity.CRITICAL,
                summary=f"the balances of {total['asset_id']} sum to {int(total['total']):+d}, not zero",
                details={"asset": total["asset_id"], "sum_of_balances": int(total["total"])},
                refs=(ObjectRef("wallets", "asset", str(total["asset_id"])),),
            )
    ctx.stats["assets"] = assets


def orphan_references_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """Every reference without a database foreign key (`ledger_orphan_references`) has its target."""
    relations = 0
    for table, column, value, relation in ledger_orphan_references_iter(chunk_size=ctx.chunk_size):
        relations += 1
        source_model, target_model = relation
        yield Discrepancy(
            kind="orphan_reference",
            severity=Severity.CRITICAL,
            summary=f"{table}.{column} = {value} points at no {target_model._meta.label_lower}",
            details={"table": table, "column": column, "value": value, "target": target_model._meta.label_lower,
                     "rows": int(source_model._default_manager.filter(**{column: value}).count())},
            refs=(),
        )
    ctx.stats["orphans"] = relations


def daily_totals_check(ctx: CheckContext) -> Iterator[Discrepancy]:
    """For each kind of account whose daily totals the tenant reads from the summary table
    (merchants', and every other account's: each staged migration switched reads), the
    summary against the sum of its entries, per (account, asset, UTC day): every day of the
    last `daily_totals_days`, and each account's latest day however old (where its balance
    at an instant starts adding up entries)."""
    for migration, label in ((DAILY_TOTALS_MIGRATION, "merchant"), (ACCOUNT_TOTALS_MIGRATION, "customer and system")):
        if not reads_new(staged_phase(migration)):
            ctx.stats[migration] = "reads from the ledger: nothing to compare"
            continue
        today = ctx.now.date()
        window = daily_totals_differences(migration=migration, day_from=today - timedelta(days=ctx.daily_totals_days - 1), day_to=today)
        seen = {key for key, _, _ in window}
        latest = [(key, ledger, summary) for key, ledger, summary in daily_totals_latest_differences(migration=migration, chunk_size=ctx.chunk_size)
                  if key not in seen]
        ctx.stats[migration] = {"differences": len(window), "latest_day_differences": len(latest)}
        for (account_id, asset, day), ledger, summary in [*window, *latest]:
            yield Discrepancy(
                kind="daily_total_mismatch", severity=Severity.CRITICAL,
                summary=f"{label} account {account_id}, {asset}, {day}: the daily totals table says {summary} "
                f"(credited, debited, entries, returned), the ledger {ledger}",
                details={"account": account_id, "asset": asset, "day": day.isoformat(), "ledger": ledger, "summary": summary},
                refs=(account_ref(account_id),),
            )

