"""New rows and balance changes of the money path in as few round trips as they can go:
the door between the ledger's and payments' services and fastpath.compiled. Both run
inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import BigIntegerField, Case, F, Model, Value, When

from fastpath.compiled import CompiledInsert, CompiledQuery, CompiledShapes, InsertBatch, Param
from wallets.models import Balance

_INSERTS: dict[type[Model], CompiledInsert[Any]] = {}


def _batch(groups: Sequence[Sequence[Model]]) -> InsertBatch:
    batch = InsertBatch()
    for objs in groups:
        if objs:
            model = type(objs[0])
            if model not in _INSERTS:
                _INSERTS[model] = CompiledInsert(model)
            batch.add(_INSERTS[model], objs)
    return batch


def rows_insert(*groups: Sequence[Model]) -> None:
    """Insert new rows as `bulk_create` would, groups of one model each, in one round trip;
    a failure marks the caller's transaction for rollback. Locks: none (new rows)."""
    _batch(groups).execute()


def rows_insert_in_savepoint(*groups: Sequence[Model]) -> str:
    """`rows_insert` in a savepoint opened in the same round trip (rolled back before a
    failure is raised); returns its id. Locks: none (new rows)."""
    return _batch(groups).execute_in_savepoint()


def balance_rows_add(*, changes: dict[int, int], held_changes: dict[int, int]) -> None:
    """One UPDATE of every changed balance row: balance = balance + its change, held
    likewise. Raises RuntimeError if a row is missing. Locks: none of its own (the caller
    holds every row already, so the order the UPDATE visits them in does not matter)."""
    balances = {pk: delta for pk, delta in changes.items() if delta != 0}
    if not balances and not held_changes:
        return
    rows = sorted(balances.keys() | held_changes.keys())
    values: dict[str, int] = {}
    for index, pk in enumerate(rows):
        values[f"row{index}"] = pk
        if balances:
            values[f"balance{index}"] = balances.get(pk, 0)
        if held_changes:
            values[f"held{index}"] = held_changes.get(pk, 0)
    updated = _BALANCES_ADD.get((len(rows), bool(balances), bool(held_changes))).update(**values)
    if updated != len(rows):
        raise RuntimeError(f"balance update changed {updated} of {len(rows)} locked rows")


def _balances_add_statement(shape: tuple[int, bool, bool]) -> CompiledQuery[Balance]:
    """UPDATE .. SET balance = balance + CASE id WHEN .. END [, held likewise] WHERE id IN (..)."""
    rows, balance, held = shape
    updates = {}
    if balance:
        updates["balance"] = F("balance") + _per_row("balance", rows=rows)
    if held:
        updates["held"] = F("held") + _per_row("held", rows=rows)
    return CompiledQuery(Balance.objects.filter(pk__in=[Param(f"row{i}") for i in range(rows)]), update=updates, prepared=True)


def _per_row(column: str, *, rows: int) -> Param | Case:
    if rows == 1:
        return Param(f"{column}0", output_field=BigIntegerField())
    whens = [When(pk=Param(f"row{i}"), then=Param(f"{column}{i}", output_field=BigIntegerField())) for i in range(rows)]
    return Case(*whens, default=Value(0), output_field=BigIntegerField())


# Compiled once per shape and process: compiling this UPDATE cost a quarter of a payment's Python.
_BALANCES_ADD: CompiledShapes[Balance] = CompiledShapes(_balances_add_statement)
