"""Server-side prepared statements for a few registered hot statements, under Django's
client-side binding.

PostgreSQL parses, analyses and plans every statement it is sent; for the payment path's
wide statements (the locking select of the balance rows joins three tables) that was
about 40% of the backend's CPU per payment (docs/BENCHMARKS.md).
psycopg's own prepared statements need server-side binding, which would send the
payment's batch of inserts (`fastpath.compiled.InsertBatch`) statement by statement and
costs more Python than it saves. So Django keeps its client-side binding,
and only the statements registered here go as prepared statements: on its first use on a
connection a registered statement is sent once as `PREPARE tally_<hash> (...) AS <its SQL
with $1..$n>`, and from then on as `EXECUTE tally_<hash> (<values>)`, the values bound
client-side as for any statement. The name is a hash of the SQL and its parameter types,
so a name means one statement on every server session, whichever process prepared it.
The SQL is unchanged, and still the ORM's own where the ORM compiled it
(`fastpath.compiled.CompiledQuery(..., prepared=True)`): Django's execute wrappers see the
registered SQL, and its query log shows it with its values, as it would unprepared
(`prepared_query_logged`). What a connection has prepared is in
`prepared_statements_of` and in PostgreSQL's `pg_prepared_statements`.

Why it is safe:
- **Tenants.** The registered SQL names unqualified tables that exist only in tenant
  schemas. A prepared statement keeps the search_path it was prepared under and is parsed
  again, by PostgreSQL, whenever the connection's search_path differs at EXECUTE, so it
  reads the current tenant's schema (tests/test_prepared_statements.py). (PostgreSQL does
  not re-parse when a table appears earlier on an unchanged path: hence tenant-only
  tables.) A connection that switches tenants re-plans at each switch, so the saving
  holds while a connection serves one tenant at a time.
- **Transactions.** A PREPARE outlives a rollback of the transaction it ran in (it is
  session state, not transactional), so a rolled-back request leaves the statement
  usable. Inside a transaction (psycopg begins one lazily: autocommit off counts) the
  PREPARE runs in its own savepoint. If PostgreSQL refuses the statement (class 42: a
  parameter whose type it cannot infer), the savepoint is rolled back, the transaction
  carries on, and the statement goes unprepared on this connection. Any other failure
  (a lock timeout, a cancel, a deadlock) is rolled back to the savepoint and raised as
  it is, as the statement itself would have failed, and the next use tries again.
- **Types.** An int parameter is declared `bigint` (PostgreSQL widens and compares
  across integer types, and cannot infer a type for a value in a CASE branch), anything
  else `unknown`, which PostgreSQL infers from where the value goes, as it does for an
  unprepared statement's literal. The same SQL called with another pattern of ints and
  non-ints is another prepared statement, so a Decimal is never rounded into a `bigint`
  declared for an earlier call's int.
- **Connections.** What is prepared is remembered per psycopg connection; a new
  connection prepares again. If the server forgets a statement (`DEALLOCATE`, `DISCARD
  ALL`: a pooler such as pgbouncer in transaction mode does that), the EXECUTE fails like
  any failed statement and this connection forgets everything it prepared. After a
  migration that changes a column's type under a prepared statement (its result type,
  or a type it compares with), the EXECUTE fails once (class 42 or 0A000) and the
  statement is prepared afresh at its next use. Behind a pooler that does not keep a
  server session per client, set TALLY_DB_PREPARED_STATEMENTS=false.
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
# Registered SQL -> its placeholder count. Registered statements are the compiled ones
# (fastpath.compiled.CompiledShapes bounds their shapes) and a few constants; past the cap,
# more are sent unprepared.
_REGISTERED: dict[str, int] = {}
_REGISTERED_MAX = 2048
# Per psycopg connection: (registered SQL, which parameters are ints) -> the EXECUTE that
# runs it there, None when PostgreSQL refused to prepare it there (it is then sent as it
# is), or _STALE when its EXECUTE failed for a type a migration changed (it is
# deallocated and prepared again at its next use).
_PREPARED: weakref.WeakKeyDictionary[Any, dict[tuple[str, tuple[bool, ...]], str | None]] = weakref.WeakKeyDictionary()
_STALE = "stale"
_SAVEPOINT = "SAVEPOINT tally_prepare;\n{};\nRELEASE SAVEPOINT tally_prepare"
_SAVEPOINT_UNDO = "ROLLBACK TO SAVEPOINT tally_prepare;\nRELEASE SAVEPOINT tally_prepare"


def prepared_statement_register(sql: str) -> str:
    """Send `sql` as a prepared statement from now on (on connections whose cursors are
    `PreparingCursor`). `sql` is Django's form: `%s` placeholders, no literal `%`; its
    tables must exist only in tenant schemas (see the module's docstring)."""
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
        """PREPARE the statement on this connection (deallocating its old version first
        when `again`); the EXECUTE that runs it, or None if PostgreSQL refuses it. Raises
        any other failure, with the caller's transaction as it was before."""
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
    """For Django's query log (`last_executed_query`): a registered statement that just
    went as EXECUTE is logged as its own SQL with its values, as it would be unprepared,
    so query logs and the tests reading them show the statement, not `EXECUTE tally_...`.
    None for anything else."""
    sent = getattr(getattr(cursor, "_query", None), "query", None)
    if not sent or not sent.startswith(b"EXECUTE tally_") or sql not in _REGISTERED:
        return None
    # On a cursor of its own: mogrify on the executing cursor would drop its results.
    with psycopg.ClientCursor(cursor.connection) as composing:
        return str(composing.mogrify(sql, params))


def prepared_statements_of(connection: Any) -> dict[str, str | None]:
    """What this psycopg connection has prepared (tests, benchmarks): SQL -> its EXECUTE
    (the last type pattern's, where the SQL went with several)."""
    return {query: execute for (query, _), execute in _PREPARED.get(connection, {}).items()}
