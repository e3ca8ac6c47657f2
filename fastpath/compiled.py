"""Compiled statements: a hot QuerySet built once with `Param` placeholders and compiled by
Django on first use; later executions reuse that SQL through the same machinery
(`ModelIterable`, `SQLUpdateCompiler.execute_sql`). Django compiled it on every execution,
which cost more Python than the rest of a payment (docs/BENCHMARKS.md).

The SQL is cached per database alias, never per tenant: the tables are unqualified,
resolved by the connection's search_path. A `Param` skips the field's
`get_db_prep_value`, so callers bind values that need no conversion (ids, codes, ints).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router, transaction
from django.db.models import Expression, Field, Model, QuerySet
from django.db.models.fields import AutoFieldMixin
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import InsertQuery, UpdateQuery
from django.db.models.sql.compiler import SQLCompiler, SQLInsertCompiler
from django.db.models.sql.constants import ROW_COUNT
from django.db.transaction import TransactionManagementError

from fastpath.prepared import prepared_statement_register

M = TypeVar("M", bound=Model)
# Up to this many rows a compiled insert sends VALUES rows of scalars (cheaper for psycopg
# to dump), past it one array per column: psycopg caches a statement's conversion only up
# to 50 parameters, and a payment's batch has 32 besides 5 per entry (47 with three).
VALUES_ROWS_MAX = 3


class _Slot:
    """What a `Param` leaves in the compiled parameters: its name, filled in per execution."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<param {self.name}>"


class Param(Expression):
    """A named placeholder for a value in a compiled statement's QuerySet."""

    def __init__(self, name: str, output_field: Field[Any, Any] | None = None) -> None:
        super().__init__(output_field=output_field)
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        return "%s", [_Slot(self.name)]

    def __repr__(self) -> str:
        return f"Param({self.name!r})"


class _Compiled:
    def __init__(self, compiler: SQLCompiler, sql: str, params: tuple[Any, ...]) -> None:
        self.compiler = compiler
        self.sql = sql
        self.template = params
        self.slots = [(i, p.name) for i, p in enumerate(params) if isinstance(p, _Slot)]

    def bind(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        params = list(self.template)
        for index, name in self.slots:
            params[index] = values[name]
        return tuple(params)

    def compiler_for(self, alias: str, values: Mapping[str, Any]) -> SQLCompiler:
        """A copy answering `as_sql` with the cached SQL, on this thread's connection."""
        compiler = copy.copy(self.compiler)
        compiler.connection = connections[alias]
        sql, params = self.sql, self.bind(values)
        compiler.as_sql = lambda *args, **kwargs: (sql, params)  # type: ignore[method-assign]
        return compiler


class _BoundQuery:
    """A QuerySet's `query` for one execution: `ModelIterable` gets the cached compiler."""

    def __init__(self, query: Any, compiler: SQLCompiler) -> None:
        self._query = query
        self._compiler = compiler

    def get_compiler(self, using: str | None = None, connection: Any = None, elide_empty: bool = True) -> SQLCompiler:
        return self._compiler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)


class CompiledQuery(Generic[M]):
    """A QuerySet compiled once per database alias: `select(**values)` runs it as
    `list(queryset)`, `update(**values)` as `queryset.update(**update)`. With `prepared`, its
    SQL goes as a server-side prepared statement (fastpath.prepared)."""

    def __init__(self, queryset: QuerySet[M], *, update: Mapping[str, Any] | None = None, prepared: bool = False) -> None:
        self._queryset = queryset
        self._update = dict(update) if update is not None else None
        self._prepared = prepared
        self._compiled: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def _compile(self, alias: str) -> _Compiled:
        compiled = self._compiled.get(alias)
        if compiled is not None:
            return compiled
        with self._lock:
            compiled = self._compiled.get(alias)
            if compiled is None:
                if self._update is None:
                    query = self._queryset.query.chain()
                else:
                    query = self._queryset.query.chain(UpdateQuery)
                    query.add_update_values(self._update)  # type: ignore[attr-defined]  # an UpdateQuery
                compiler = query.get_compiler(using=alias)
                sql, params = compiler.as_sql()
                compiler.connection = None  # each run binds its own thread's (compiler_for)
                if self._prepared:
                    prepared_statement_register(sql)
                compiled = _Compiled(compiler, sql, tuple(params))
                self._compiled[alias] = compiled
        return compiled

    def _alias(self) -> str:
        # As Django routes them: a locking select goes where writes go.
        if self._update is None and not self._queryset.query.select_for_update:
            return str(router.db_for_read(self._queryset.model))
        return str(router.db_for_write(self._queryset.model))

    def sql_with_params(self, **values: Any) -> tuple[str, tuple[Any, ...]]:
        """The SQL and parameters an execution with `values` sends (for the tests)."""
        compiled = self._compile(self._alias())
        return compiled.sql, compiled.bind(values)

    def select(self, **values: Any) -> list[M]:
        if self._update is not None:
            raise TypeError("an update statement has no rows to select")
        alias = self._alias()
        compiled = self._compile(alias)
        if self._queryset.query.select_for_update and connections[alias].get_autocommit():
            # The check Django's compiler makes in as_sql, which a cached execution skips.
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        bound: Any = _BoundQuery(self._queryset.query, compiled.compiler_for(alias, values))
        return list(QuerySet(model=self._queryset.model, query=bound, using=alias))

    def update(self, **values: Any) -> int:
        if self._update is None:
            raise TypeError("built without update values")
        alias = self._alias()
        compiled = self._compile(alias)
        connection = connections[alias]
        if not connection.in_atomic_block:
            raise RuntimeError("a compiled update runs inside the caller's transaction")
        compiler: Any = compiled.compiler_for(alias, values)
        with transaction.mark_for_rollback_on_error(using=alias):  # as QuerySet.update does
            rows = compiler.execute_sql(ROW_COUNT)
        return int(rows or 0)


class CompiledShapes(Generic[M]):
    """Compiled statements keyed by shape, each built once with `build(shape)`; at most
    `max_shapes` kept (then it starts over), so odd shapes cannot grow a process."""

    def __init__(self, build: Callable[[Any], CompiledQuery[M]], *, max_shapes: int = 256) -> None:
        self._build = build
        self._max_shapes = max_shapes
        self._by_shape: dict[Hashable, CompiledQuery[M]] = {}
        self._lock = threading.Lock()

    def get(self, shape: Hashable) -> CompiledQuery[M]:
        statement = self._by_shape.get(shape)
        if statement is None:
            with self._lock:
                statement = self._by_shape.get(shape)
                if statement is None:
                    if len(self._by_shape) >= self._max_shapes:
                        self._by_shape.clear()
                    statement = self._build(shape)
                    self._by_shape[shape] = statement
        return statement


class CompiledInsert(Generic[M]):
    """The INSERT of instances of one model, compiled by Django's SQLInsertCompiler once per
    alias and row count, its values prepared as `bulk_create` prepares them. An auto primary
    key is not read back (append-only rows). While a pre_save or post_save receiver listens
    for the model, it falls back to `save()` / `bulk_create`, so no signal is skipped."""

    def __init__(self, model: type[M]) -> None:
        self._model = model
        meta = model._meta
        self._auto_pk = isinstance(meta.pk, AutoFieldMixin)
        self._fields = [f for f in meta.local_concrete_fields if not f.generated and not (self._auto_pk and f.primary_key)]
        self._sql: dict[tuple[str, int], tuple[str, bool]] = {}
        self._lock = threading.Lock()

    def _compile(self, alias: str, objs: Sequence[M]) -> tuple[str, bool] | None:
        """(SQL, whether it takes one array per column), or None when Django's form fits neither."""
        key = (alias, len(objs))
        compiled = self._sql.get(key)
        if compiled is None:
            query = InsertQuery(self._model)
            query.insert_values(self._fields, list(objs))
            compiler: Any = query.get_compiler(using=alias)
            if len(objs) <= VALUES_ROWS_MAX:  # Django's generic VALUES form (see VALUES_ROWS_MAX)
                compiler.assemble_as_sql = functools.partial(SQLInsertCompiler.assemble_as_sql, compiler)
            [(sql, params)] = compiler.as_sql()
            columns, placeholders = len(self._fields), sql.count("%s")
            if len(objs) > 1 and placeholders == columns == len(params) and "UNNEST" in sql:
                compiled = (sql, True)
            elif placeholders == columns * len(objs) == len(params):
                compiled = (sql, False)
            else:
                return None
            with self._lock:
                self._sql[key] = compiled
        return compiled

    def insert(self, obj: M) -> M:
        self.insert_many([obj])
        return obj

    def insert_many(self, objs: Sequence[M]) -> None:
        batch = InsertBatch()
        batch.add(self, objs)
        batch.execute()

    def _alias(self) -> str:
        return str(router.db_for_write(self._model))

    def _statement(self, alias: str, objs: Sequence[M]) -> tuple[str, list[Any]] | None:
        """The compiled INSERT of `objs` and its values, or None to go through `save()` / `bulk_create`."""
        if not self._auto_pk and any(obj.pk is None for obj in objs):
            raise ValueError("a compiled insert of this model needs the primary key set in Python")
        if pre_save.has_listeners(self._model) or post_save.has_listeners(self._model):
            return None
        compiled = self._compile(alias, objs)
        if compiled is None:
            return None
        sql, per_column = compiled
        connection = connections[alias]
        rows = [[field.get_db_prep_save(field.pre_save(obj, True), connection=connection) for field in self._fields] for obj in objs]
        params = [list(column) for column in zip(*rows, strict=True)] if per_column else [value for row in rows for value in row]
        return sql, params

    def _insert_with_save(self, alias: str, objs: Sequence[M]) -> None:
        if len(objs) == 1:
            objs[0].save(force_insert=True, using=alias)
        else:
            self._model._default_manager.using(alias).bulk_create(objs)

    @staticmethod
    def _mark_saved(alias: str, objs: Sequence[M]) -> None:
        for obj in objs:
            obj._state.adding = False
            obj._state.db = alias


class InsertBatch:
    """Compiled inserts sent in order as one statement string, one round trip (a payment's
    savepoint and four inserts went as five); one by one with server-side binding, or around
    an insert that goes through `save()`. A failed `execute` marks the transaction for
    rollback, as a failed insert does; `execute_in_savepoint` rolls back to its savepoint."""

    def __init__(self) -> None:
        self._alias: str | None = None
        self._steps: list[tuple[CompiledInsert[Any], Sequence[Model], tuple[str, list[Any]] | None]] = []

    def add(self, insert: CompiledInsert[M], objs: Sequence[M]) -> None:
        if not objs:
            return
        alias = insert._alias()
        if self._alias is None:
            self._alias = alias
        elif alias != self._alias:
            raise ValueError(f"one batch writes to one database, not {self._alias} and {alias}")
        self._steps.append((insert, objs, insert._statement(alias, objs)))

    def execute(self) -> None:
        """Send what was added, in order; the batch is empty afterwards. Locks: none (new rows)."""
        self._send(savepoint=False)

    def execute_in_savepoint(self) -> str:
        """`execute` after a savepoint opened in the same round trip; returns its id, as
        `transaction.savepoint()` would. Locks: none (new rows)."""
        sid = self._send(savepoint=True)
        assert sid is not None
        return sid

    def _send(self, *, savepoint: bool) -> str | None:
        steps, self._steps = self._steps, []
        if not steps and not savepoint:
            return None
        alias = self._alias or DEFAULT_DB_ALIAS
        connection = connections[alias]
        together = sends_statements_together(connection)
        pending: list[tuple[str, list[Any]]] = []
        done: list[tuple[CompiledInsert[Any], Sequence[Model]]] = []
        sid = None
        if savepoint:
            if connection.get_autocommit():
                raise TransactionManagementError("a savepoint needs a transaction")
            sid = _batch_savepoint_name(connection)
            pending.append((connection.ops.savepoint_create_sql(sid), []))

        def flush() -> None:
            if not pending:
                return
            sql = ";\n".join(statement for statement, _ in pending)
            params = [value for _, values in pending for value in values]
            # In its own savepoint a failure is rolled back below; otherwise, as save() does.
            marking = transaction.mark_for_rollback_on_error(using=alias) if sid is None else contextlib.nullcontext()
            with marking, connection.cursor() as cursor:
                cursor.execute(sql, params)
            pending.clear()
            for insert, objs in done:
                insert._mark_saved(alias, objs)
            done.clear()

        doomed_before = connection.in_atomic_block and transaction.get_rollback(using=alias)
        try:
            if not together:
                flush()  # the savepoint alone
            for insert, objs, statement in steps:
                if statement is None:
                    flush()
                    insert._insert_with_save(alias, objs)
                    continue
                pending.append(statement)
                done.append((insert, objs))
                if not together:
                    flush()
            flush()
        except BaseException:
            if sid is not None:
                self._rollback_to(alias, sid, doomed_before=doomed_before)
            raise
        return sid

    @staticmethod
    def _rollback_to(alias: str, sid: str, *, doomed_before: bool) -> None:
        """Back to the batch's savepoint, as a failed inner `atomic` does. A rollback mark a
        save() among the inserts set is lifted, and put back only if it was there before
        or the rollback itself fails."""
        connection = connections[alias]
        if connection.in_atomic_block:
            transaction.set_rollback(False, using=alias)
        try:
            transaction.savepoint_rollback(sid, using=alias)
        except DatabaseError:
            if connection.in_atomic_block:
                transaction.set_rollback(True, using=alias)
            return
        if doomed_before:
            transaction.set_rollback(True, using=alias)


# One compiled insert per model, made on its first rows.
_INSERTS: dict[type[Model], CompiledInsert[Any]] = {}


def _insert_batch(groups: Sequence[Sequence[Model]]) -> InsertBatch:
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
    _insert_batch(groups).execute()


def rows_insert_in_savepoint(*groups: Sequence[Model]) -> str:
    """`rows_insert` in a savepoint opened in the same round trip (rolled back before a
    failure is raised); returns its id. Locks: none (new rows)."""
    return _insert_batch(groups).execute_in_savepoint()


def sends_statements_together(connection: Any) -> bool:
    """Whether this open connection's cursors bind client-side (psycopg's ClientCursor),
    which lets one execute carry several statements."""
    connection.ensure_connection()
    return issubclass(connection.connection.cursor_factory, psycopg.ClientCursor)


def _batch_savepoint_name(connection: Any) -> str:
    """A name no earlier savepoint of this transaction has (a shared name would let a batch
    that failed before its SAVEPOINT roll back an earlier batch), and the same on every
    payment, so psycopg converts the batch string once (fastpath.backend)."""
    return str(connection.savepoint_name_in_transaction("tally_batch"))
