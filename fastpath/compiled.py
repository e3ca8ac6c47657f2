"""Compiled statements: the ORM's own SQL for a hot statement, compiled once per shape.

Django compiles a QuerySet to SQL on every execution: resolving lookups through joins,
quoting, building `CASE` expressions. On the payment path that compilation cost more
Python than everything else the payment does (docs/BENCHMARKS.md). A compiled
statement is an ordinary QuerySet built once with `Param` placeholders where its values
go; its first execution compiles it through Django's compiler, and later executions reuse
that SQL with new values, through the same compiler machinery: rows still come back as
model instances (`select_related` included) through Django's `ModelIterable`, updates
still run through `SQLUpdateCompiler.execute_sql`, inside the caller's transaction.

What is cached is SQL text and the positions of the placeholders, per database alias and
never per tenant: the statements name unqualified tables, which the connection's
search_path resolves to the tenant's schema, as any ORM statement does.

Values go to the database as given: a `Param` is not passed through a field's
`get_db_prep_value`, so callers bind values that need no conversion (ids, codes, ints).
tests/test_compiled_statements.py checks each hot statement's cached SQL and bound
parameters against what the ORM compiles for the same QuerySet built with real values.
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
# Up to this many rows, a compiled insert sends one VALUES row of scalars per object, which
# psycopg dumps for less than one array per column; past it, Django's one array per column.
# The bound is psycopg's, not the planner's: psycopg converts a statement string once and
# caches it only while it has at most 50 parameters (MAX_CACHED_STATEMENT_PARAMS), and
# parses the whole string again on every execute past that. A payment's batch has 28
# parameters besides its entries' 5 each: 38 with two entries, 48 with four (one reward),
# and with six as VALUES rows it would have 58, so six go as arrays (33)
# (tests/test_ledger.py).
VALUES_ROWS_MAX = 4


class _Slot:
    """What a `Param` leaves in the compiled parameters: its name, filled in per execution."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<param {self.name}>"


class Param(Expression):
    """A named placeholder for a value in a compiled statement's QuerySet (a filter's
    right-hand side, an `F()` increment, a `When`'s condition or result)."""

    def __init__(self, name: str, output_field: Field[Any, Any] | None = None) -> None:
        super().__init__(output_field=output_field)
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        return "%s", [_Slot(self.name)]

    def __repr__(self) -> str:
        return f"Param({self.name!r})"


class _Compiled:
    """One alias's compiled form: a prepared compiler, the SQL and the parameter template."""

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
        """A copy of the prepared compiler (its select, klass_info and converters are
        read-only after preparation) that answers `as_sql` with the cached SQL, on this
        thread's connection: Django's connections are per thread, and the prepared
        compiler holds the one of the thread that compiled it."""
        compiler = copy.copy(self.compiler)
        compiler.connection = connections[alias]
        sql, params = self.sql, self.bind(values)
        compiler.as_sql = lambda *args, **kwargs: (sql, params)  # type: ignore[method-assign]
        return compiler


class _BoundQuery:
    """Stands in for a QuerySet's `query` for one execution: `ModelIterable` asks it for
    a compiler and gets the cached one. Everything else is read from the real query."""

    def __init__(self, query: Any, compiler: SQLCompiler) -> None:
        self._query = query
        self._compiler = compiler

    def get_compiler(self, using: str | None = None, connection: Any = None, elide_empty: bool = True) -> SQLCompiler:
        return self._compiler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)


class CompiledQuery(Generic[M]):
    """A QuerySet compiled once per database alias and run many times with new values.

    `select(**values)` returns the rows as model instances, as `list(queryset)` would;
    `update(**values)` runs `queryset.update(**update)` for the `update` mapping given at
    construction and returns the row count. Every `Param` name must be given a value.
    With `prepared`, its SQL goes to PostgreSQL as a server-side prepared statement,
    parsed and planned once per connection (fastpath.prepared).
    """

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
        """The SQL and parameters an execution with `values` sends (tests compare them with
        the ORM's own)."""
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
    """Compiled statements of one kind keyed by shape (how many rows, which columns, which
    constants): `get(shape)` builds the statement for a new shape once with `build(shape)`.
    At most `max_shapes` are kept (then it starts over), so odd shapes cannot grow a
    process without bound."""

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
    """`INSERT INTO <table> (<columns>) ..` of instances of one model, compiled by Django's
    SQLInsertCompiler once per alias and row count: Django's VALUES form up to
    VALUES_ROWS_MAX rows, its UNNEST form (one array per column) for more. Each insert
    prepares its values as Django does (`field.pre_save(obj, add=True)`, then
    `get_db_prep_save`) and marks the instances saved, like `save(force_insert=True)` /
    `bulk_create` without the machinery around them.

    A model whose primary key is set in Python (an id default) inserts every concrete
    column; one with an auto primary key leaves it to the database and, as this is for
    append-only rows nobody reads back in the same transaction, does not read it back.
    `save()` also sends pre_save and post_save; while any receiver listens for the model,
    `insert` falls back to `save(force_insert=True)` / `bulk_create`, so no signal is
    ever skipped.
    """

    def __init__(self, model: type[M]) -> None:
        self._model = model
        meta = model._meta
        self._auto_pk = isinstance(meta.pk, AutoFieldMixin)
        self._fields = [f for f in meta.local_concrete_fields if not f.generated and not (self._auto_pk and f.primary_key)]
        self._sql: dict[tuple[str, int], tuple[str, bool]] = {}
        self._lock = threading.Lock()

    def _compile(self, alias: str, objs: Sequence[M]) -> tuple[str, bool] | None:
        """(SQL, whether it takes one array per column) or None when Django's form for
        these rows is not one placeholder per value or per column."""
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
        if not objs:
            return
        alias = self._alias()
        statement = self._statement(alias, objs)
        if statement is None:
            self._insert_with_save(alias, objs)
            return
        connection = connections[alias]
        with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:  # as save() does
            cursor.execute(*statement)
        self._mark_saved(alias, objs)

    def _alias(self) -> str:
        return str(router.db_for_write(self._model))

    def _statement(self, alias: str, objs: Sequence[M]) -> tuple[str, list[Any]] | None:
        """The compiled INSERT of `objs` and its values, or None when it must go through
        `save()` / `bulk_create` (a signal receiver listens, or Django's form does not fit)."""
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
    """Compiled inserts of new rows sent to the database together: `add` prepares each
    insert's SQL and values at once (so an instance changed afterwards is inserted as it
    was), `execute` sends them in order, as one statement string in one round trip.

    A statement costs Python whatever it does (a Django cursor, psycopg's query
    conversion, the round trip); the savepoint and four inserts a payment makes before it
    locks its rows went as five.
    Several statements in one string need psycopg's client-side binding, Django's default;
    on a connection with server-side binding (`OPTIONS["server_side_binding"]`) each goes
    on its own (`sends_statements_together`). An insert that must go through `save()` (a
    signal receiver listens) is sent on its own, in its place in the order. A failure of
    `execute` leaves the transaction as a failed single insert does (marked for
    rollback); `execute_in_savepoint` rolls a failure back to its savepoint and leaves the
    transaction usable. Everything added goes to the database `add`'s model routes to for
    writes, which must be one database per batch.
    """

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
        """`execute`, after opening a savepoint in the same round trip; returns its id for
        `transaction.savepoint_rollback`, as `transaction.savepoint()` would, one round
        trip fewer. If sending fails, this rolls back to it before raising: a failed
        execute leaves none of its rows. Locks: none (new rows)."""
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
        """Back to the batch's savepoint, as an inner `atomic` block that fails goes back to
        its own: the transaction carries on as it was before the batch. A save() among the
        inserts may have marked it for rollback; that mark is lifted for the rollback and
        put back only if it was there before, or if the rollback itself fails (the
        savepoint never opened, or the connection is gone)."""
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


def sends_statements_together(connection: Any) -> bool:
    """Whether this connection's cursors bind values client-side (psycopg's ClientCursor,
    Django's default), which lets one execute carry several statements; a server-side
    binding cursor prepares each execute as one statement. Asked of the open connection,
    not the settings: its cursor class was fixed when it connected."""
    connection.ensure_connection()
    return issubclass(connection.connection.cursor_factory, psycopg.ClientCursor)


def _batch_savepoint_name(connection: Any) -> str:
    """A name no earlier savepoint of this transaction has. One name shared by every batch
    would let a batch that fails before its SAVEPOINT ran go back to an earlier batch's
    savepoint of the same name, undoing that batch. The project's backend
    (fastpath.backend, the only ENGINE) counts
    them per transaction, so the payment's batch string is the same on every payment and
    psycopg converts it once."""
    return str(connection.savepoint_name_in_transaction("tally_batch"))
