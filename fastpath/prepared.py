"""Server-side prepared statements for a few registered hot statements, under Django's
client-side binding: parsing and planning the payment path's wide statements was about 40%
of the backend's CPU per payment (docs/BENCHMARKS.md), and psycopg's own prepared
statements need server-side binding, which would split the batch of inserts. A registered
statement goes once per connection as `PREPARE tally_<hash of SQL and parameter types>
(...) AS <SQL with $1..$n>`, then as `EXECUTE tally_<hash> (<values>)`.

Why it is safe:
- Tenants: PostgreSQL parses a prepared statement again whenever the search_path differs
  at EXECUTE, but not when a table appears earlier on an unchanged path: hence
  unqualified, tenant-only tables.
- Transactions: a PREPARE outlives a rollback; inside a transaction it runs in its own
  savepoint. A statement PostgreSQL refuses (class 42) goes unprepared on this connection;
  any other failure is rolled back to the savepoint and raised.
- Types: an int parameter is declared `bigint` (no type is inferred in a CASE branch),
  anything else `unknown`. Another pattern of ints is another statement, so a Decimal is
  never rounded into a `bigint`.
- Connections: if the server forgets a statement (`DISCARD ALL` behind a pooler), the
  EXECUTE fails and the connection forgets all it prepared; after a migration changes a
  type under one (class 42 or 0A000) it is prepared afresh. Behind a pooler without
  session affinity, set TALLY_DB_PREPARED_STATEMENTS=false (docs/SCALING.md).
"""

from __future__ import annotations

import hashlib
import re
import weakref
from typing import TYPE_CHECKING, Any

import psycopg
from django.db.backends.postgresql.base import Cursor
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

if TYPE_CHECKING:
    # What Django's Cursor is at run time (django-stubs declare it as its mixin alone).
    _DjangoCursor = psycopg.ClientCursor[Any]
else:
    _DjangoCursor = Cursor

_PLACEHOLDER = re.compile(r"%s")
# Registered SQL -> its placeholder count; past the cap, more are sent unprepared.
_REGISTERED: dict[str, int] = {}
_REGISTERED_MAX = 2048
# Per psycopg connection: (SQL, which parameters are ints) -> its EXECUTE there, None when
# PostgreSQL refused to prepare it, or _STALE when a type changed under it.
_PREPARED: weakref.WeakKeyDictionary[Any, dict[tuple[str, tuple[bool, ...]], str | None]] = weakref.WeakKeyDictionary()
_STALE = "stale"
_SAVEPOINT = "SAVEPOINT tally_prepare;\n{};\nRELEASE SAVEPOINT tally_prepare"
_SAVEPOINT_UNDO = "ROLLBACK TO SAVEPOINT tally_prepare;\nRELEASE SAVEPOINT tally_prepare"


def prepared_statement_register(sql: str) -> str:
    """Send `sql` (`%s` placeholders, no literal `%`, tenant-only tables) prepared from now
    on, on connections whose cursors are `PreparingCursor`."""
    if "%%" in sql or "%(" in sql:
        raise ValueError("a prepared statement takes %s placeholders only, and no literal %")
    if sql not in _REGISTERED and len(_REGISTERED) < _REGISTERED_MAX:
        _REGISTERED[sql] = len(_PLACEHOLDER.findall(sql))
    return sql


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prepared_statement_name(sql: str, ints: tuple[bool, ...]) -> str:
    """The statement's name on every connection: a hash of its SQL and parameter types."""
    digest = hashlib.sha256(repr(ints).encode() + b"\0" + sql.encode()).hexdigest()
    return "tally_" + digest[:32]


class PreparingCursor(_DjangoCursor):
    """Django's client-side binding cursor, sending registered statements prepared."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        count = _REGISTERED.get(query) if params and type(query) is str and isinstance(params, (list, tuple)) else None
        if count is None or len(params) != count:
            return super().execute(query, params, **kwargs)
        statements = _PREPARED.get(self.connection)
        if statements is None:
            statements = _PREPARED[self.connection] = {}
        key = (query, tuple(map(_is_int, params)))
        execute = statements.get(key, "")
        if execute == "" or execute == _STALE:
            if self.connection.info.transaction_status == TransactionStatus.INERROR:
                return super().execute(query, params, **kwargs)  # it fails as it is; prepare it later
            execute = statements[key] = self._prepare(key, again=execute == _STALE)
        if execute is None:
            return super().execute(query, params, **kwargs)
        try:
            return super().execute(execute, params, **kwargs)
        except pg_errors.InvalidSqlStatementName:
            statements.clear()  # the server forgot them: prepare again, from the next statement
            raise
        except psycopg.DatabaseError as failure:
            if (failure.sqlstate or "").startswith(("42", "0A")):
                statements[key] = _STALE  # a type changed under it: prepare it afresh next time
            raise

    def _prepare(self, key: tuple[str, tuple[bool, ...]], *, again: bool) -> str | None:
        """PREPARE the statement (DEALLOCATE it first when `again`); its EXECUTE, or None if
        PostgreSQL refuses it. Other failures are raised, the caller's transaction as it was."""
        query, ints = key
        name = prepared_statement_name(query, ints)
        positions = iter(range(1, len(ints) + 1))
        prepare = (
            f"PREPARE {name} ({', '.join('bigint' if is_int else 'unknown' for is_int in ints)}) AS "
            + _PLACEHOLDER.sub(lambda _: f"${next(positions)}", query)
        )
        if again:
            prepare = f"DEALLOCATE {name};\n{prepare}"
        # psycopg begins a transaction lazily, at the first statement after autocommit is off.
        in_transaction = not self.connection.autocommit or self.connection.info.transaction_status != TransactionStatus.IDLE
        try:
            super().execute(_SAVEPOINT.format(prepare) if in_transaction else prepare)
        except psycopg.DatabaseError as failure:
            if in_transaction and self.connection.info.transaction_status == TransactionStatus.INERROR:
                super().execute(_SAVEPOINT_UNDO)
            if isinstance(failure, pg_errors.DuplicatePreparedStatement):
                pass  # prepared on this session already (the name is the statement itself)
            elif isinstance(failure, pg_errors.InvalidSqlStatementName) and again:
                return self._prepare(key, again=False)  # nothing to deallocate
            elif (failure.sqlstate or "").startswith("42"):
                return None  # PostgreSQL will not prepare this statement: send it as it is
            else:
                raise
        return f"EXECUTE {name} ({', '.join(['%s'] * len(ints))})"


def prepared_query_logged(cursor: Any, sql: Any, params: Any) -> str | None:
    """For Django's query log: a registered statement that went as EXECUTE, as its own SQL
    with its values (None for anything else)."""
    sent = getattr(getattr(cursor, "_query", None), "query", None)
    if not sent or not sent.startswith(b"EXECUTE tally_") or sql not in _REGISTERED:
        return None
    # On a cursor of its own: mogrify on the executing cursor would drop its results.
    with psycopg.ClientCursor(cursor.connection) as composing:
        return str(composing.mogrify(sql, params))


def prepared_statements_of(connection: Any) -> dict[str, str | None]:
    """What this psycopg connection has prepared (tests, benchmarks): SQL -> its EXECUTE."""
    return {query: execute for (query, _), execute in _PREPARED.get(connection, {}).items()}
