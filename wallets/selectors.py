"""Read selectors for parties and keys."""

from __future__ import annotations

from typing import Any, TypeVar

from django.apps import apps
from django.db import connection
from django.db.models import ForeignKey, Model
from django.utils import timezone

from wallets.models import ApiKey, Customer, Merchant, StaffMember, Store, Terminal
from wallets.services.principals import api_key_hash

M = TypeVar("M", bound=Model)


def api_key_get_active(*, raw_key: str) -> ApiKey | None:
    """The live key row for `raw_key`, or None if unknown, revoked or past its overlap window.

    Runs on every API request, so it is two indexed single-table statements in raw SQL
    (the key by its hash, then its principal; a terminal with its store): the ORM's query
    compilation cost more than the database work, and one six-table join cost ~0.5 ms of
    planning per request. Rows become real model instances through `Model.from_db`.
    """
    key = _fetch_one(
        ApiKey,
        "a.key_hash = %s AND a.revoked_at IS NULL AND (a.expires_at IS NULL OR a.expires_at > %s)",
        [api_key_hash(raw_key), timezone.now()],
    )
    if key is None:
        return None
    if key.customer_id is not None:
        key.customer = _fetch_one(Customer, "a.id = %s", [key.customer_id])
    elif key.merchant_id is not None:
        key.merchant = _fetch_one(Merchant, "a.id = %s", [key.merchant_id])
    elif key.terminal_id is not None:
        terminal = _fetch_one(Terminal, "a.id = %s", [key.terminal_id], join=Store, join_on="store_id")
        if terminal is None:
            return None
        key.terminal = terminal
    elif key.staff_id is not None:
        key.staff = StaffMember.objects.select_related("user").get(pk=key.staff_id)
    return key


def _columns(model: type[Model], alias: str) -> tuple[list[str], str]:
    fields = model._meta.concrete_fields
    return [f.attname for f in fields], ", ".join(f'{alias}."{f.column}"' for f in fields)


def _fetch_one(
    model: type[M], where: str, params: list[Any], *, join: type[Model] | None = None, join_on: str = ""
) -> M | None:
    """One row of `model` (and optionally the row it points to through `join_on`) as
    model instances, from a raw single statement. `where` is trusted SQL (never client
    input) naming `model`'s columns as `a.<column>`; values go in `params`."""
    names, select = _columns(model, "a")
    table = model._meta.db_table
    sql = f'SELECT {select}'
    if join is not None:
        join_names, join_select = _columns(join, "b")
        sql += f', {join_select} FROM "{table}" a JOIN "{join._meta.db_table}" b ON b."{join._meta.pk.column}" = a."{join_on}"'
    else:
        join_names = []
        sql += f' FROM "{table}" a'
    sql += f" WHERE {where} LIMIT 1"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    obj = model.from_db(connection.alias, names, row[: len(names)])
    if join is not None:
        related = join.from_db(connection.alias, join_names, row[len(names):])
        setattr(obj, join_on.removesuffix("_id"), related)
    return obj


# --- Ledger integrity (reconciliation and tests) -------------------------------------


def ledger_unbalanced_transactions() -> list[tuple[str, str, int]]:
    """(transaction id, asset, sum) of every ledger transaction whose entries do not sum to zero per asset."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT transaction_id, asset_id, SUM(amount) FROM wallets_ledgerentry GROUP BY transaction_id, asset_id HAVING SUM(amount) <> 0"
        )
        return [(str(t), str(a), int(s)) for t, a, s in cursor.fetchall()]


def balance_entry_mismatches() -> list[tuple[str, str, int, int]]:
    """(account, asset, balance, sum of entries) wherever a balance differs from its entries."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH b AS (SELECT account_id, asset_id, SUM(balance) AS total FROM wallets_balance GROUP BY 1, 2),
                 e AS (SELECT account_id, asset_id, SUM(amount) AS total FROM wallets_ledgerentry GROUP BY 1, 2)
            SELECT COALESCE(b.account_id, e.account_id), COALESCE(b.asset_id, e.asset_id), COALESCE(b.total, 0), COALESCE(e.total, 0)
              FROM b FULL OUTER JOIN e ON b.account_id = e.account_id AND b.asset_id = e.asset_id
             WHERE COALESCE(b.total, 0) <> COALESCE(e.total, 0)
            """
        )
        return [(str(acc), str(asset), int(bal), int(ent)) for acc, asset, bal, ent in cursor.fetchall()]


def asset_totals() -> dict[str, int]:
    """Sum of every balance per asset: zero when money is conserved (system accounts hold the other side)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT asset_id, SUM(balance) FROM wallets_balance GROUP BY asset_id")
        return {str(asset): int(total) for asset, total in cursor.fetchall()}


# Apps whose tables live in the tenant schema and may hold foreign keys without a
# database constraint (the hot append-only tables: wallets/0004-0005, payments/0003-0005).
_TENANT_APP_LABELS = ("wallets", "payments", "idempotency", "webhooks")


def unconstrained_references() -> list[tuple[str, str, str, str]]:
    """(table, column, target table, target column) of every tenant foreign key declared
    with `db_constraint=False`: the references the database does not check itself.

    The targets are protected by delete/primary-key triggers (wallets/0006);
    `ledger_orphan_references` checks the rows.
    """
    relations = []
    for label in _TENANT_APP_LABELS:
        for model in apps.get_app_config(label).get_models():
            for field in model._meta.concrete_fields:
                if isinstance(field, ForeignKey) and not getattr(field, "db_constraint", True):
                    target = field.target_field
                    relations.append((model._meta.db_table, str(field.column), target.model._meta.db_table, str(target.column)))
    return sorted(relations)


def ledger_orphan_references() -> list[tuple[str, str, str]]:
    """(table, column, value) of every reference, in a table without its database foreign
    keys, that points at no row: ledger entries -> transaction, account, asset; payments ->
    customer, merchant, store, terminal, asset, ledger transaction. Empty when sound.

    One anti-join per relation. A dangling value shared by several rows is listed once.
    """
    orphans: list[tuple[str, str, str]] = []
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table, column, target_table, target_column in unconstrained_references():
            # Identifiers come from model metadata (never input), quoted.
            ref, tgt = f"r.{qn(column)}", f"t.{qn(target_column)}"
            sql = (
                f"SELECT DISTINCT {ref} FROM {qn(table)} r WHERE {ref} IS NOT NULL "  # noqa: S608
                f"AND NOT EXISTS (SELECT 1 FROM {qn(target_table)} t WHERE {tgt} = {ref}) ORDER BY 1"
            )
            cursor.execute(sql)
            orphans += [(table, column, str(value)) for (value,) in cursor.fetchall()]
    return orphans
