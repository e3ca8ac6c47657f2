"""Server-side prepared statements for a few registered hot statements, under Django's
client-side binding.

PostgreSQL parses, analyses and plans every statement it is sent; for the payment path's
wide statements (the locking select of the balance rows joins three tables) that was
about 40% of the backend's CPU per payment (docs/BENCHMARKS.md, issue 13, seventh pass).
psycopg's own prepared statements need server-side binding, which would send the
payment's batch of inserts (`wallets.compiled.InsertBatch`) statement by statement and
costs more Python than it saves (seventh pass). So Django keeps its client-side binding,
and only the statements registered here go as prepared statements: on its first use on a
connection a registered statement is sent once as `PREPARE tally_N (...) AS <its SQL with
$1..$n>`, and from then on as `EXECUTE tally_N(<values>)`, the values bound client-side
as for any statement. The SQL is unchanged, and still the ORM's own where the ORM
compiled it (`wallets.compiled.CompiledQuery(..., prepared=True)`): Django's execute
wrappers see the registered SQL, and its query log shows it with its values, as it would
unprepared (`prepared_query_logged`). What a connection has prepared is in
`prepared_statements_of` and in PostgreSQL's `pg_prepared_statements`.

Why it is safe:
- **Tenants.** The registered SQL names unqualified tables. A prepared statement keeps
  the search_path it was prepared under and is parsed again, by PostgreSQL, whenever the
  connection's search_path differs at EXECUTE, so it always reads the current tenant's
  schema (tests/test_prepared_statements.py).
- **Transactions.** A PREPARE outlives a rollback of the transaction it ran in (it is
  session state, not transactional), so a rolled-back request leaves the statement
  usable. Inside a transaction the PREPARE runs in its own savepoint: if PostgreSQL
  refuses it (a parameter whose type it cannot infer), the savepoint is rolled back, the
  transaction carries on as before, and that statement goes unprepared on this
  connection.
- **Types.** An int parameter is declared `bigint` (PostgreSQL widens and compares
  across integer types, and cannot infer a type for a value in a CASE branch), anything
  else `unknown`, which PostgreSQL infers from where the value goes, as it does for an
  unprepared statement's literal.
- **Connections.** What is prepared is remembered per psycopg connection; a new
  connection prepares again. If the server forgets a statement (`DEALLOCATE`, `DISCARD
  ALL`: a pooler such as pgbouncer in transaction mode does that), the EXECUTE fails like
  any failed statement and this connection forgets everything it prepared. Behind such a
  pooler, set TALLY_DB_PREPARED_STATEMENTS=false. Likewise after a migration that changes
  the type of a column a prepared select returns: PostgreSQL refuses the old statement
  once per connection, and the connection prepares afresh.
"""

from __future__ import annotations

import itertools
import re
import weakref
from typing import Any

import psycopg
from django.db.backends.postgresql.base import Cursor
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

_PLACEHOLDER = re.compile(r"%s")
# Registered SQL -> its placeholder count. Registered statements are the compiled ones,
# which are bounded (wallets.compiled.CompiledShapes), and a few constants.
_REGISTERED: dict[str, int] = {}
# Per psycopg connection: registered SQL -> the EXECUTE that runs it there, or None when
# PostgreSQL refused to prepare it on that connection (it is then sent as it is).
_PREPARED: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()
_names = itertools.count(1)  # unique in the process, so on every connection it has


def prepared_statement_register(sql: str) -> str:
    """Send `sql` as a prepared statement from now on (on connections whose cursors are
    `PreparingCursor`). `sql` is Django's form: `%s` placeholders, no literal `%`."""
    if "%%" in sql or "%(" in sql:
        raise ValueError("a prepared statement takes %s placeholders only, and no literal %")
    _REGISTERED[sql] = len(_PLACEHOLDER.findall(sql))
    return sql


def _pg_type(value: Any) -> str:
    return "bigint" if isinstance(value, int) and not isinstance(value, bool) else "unknown"


class PreparingCursor(Cursor):  # type: ignore[misc]
    """Django's client-side binding cursor, sending registered statements prepared."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        count = _REGISTERED.get(query) if params and type(query) is str and isinstance(params, (list, tuple)) else None
        if count is None or len(params) != count:
            return super().execute(query, params, **kwargs)
        statements = _PREPARED.get(self.connection)
        if statements is None:
            statements = _PREPARED[self.connection] = {}
        execute = statements.get(query, "")
        if execute == "":
            if self.connection.info.transaction_status == TransactionStatus.INERROR:
                return super().execute(query, params, **kwargs)  # it fails as it is; prepare it later
            execute = statements[query] = self._prepare(query, params, name=f"tally_{next(_names)}")
        if execute is None:
            return super().execute(query, params, **kwargs)
        try:
            return super().execute(execute, params, **kwargs)
        except (pg_errors.InvalidSqlStatementName, pg_errors.FeatureNotSupported):
            # The server forgot them, or a migration changed the type of a column one of
            # them returns ("cached plan must not change result type"): this statement
            # fails like any other, and the connection prepares afresh from the next one.
            statements.clear()
            raise

    def _prepare(self, query: str, params: Any, *, name: str) -> str | None:
        """PREPARE `query` on this connection; the EXECUTE that runs it, or None if
        PostgreSQL refused it (the transaction, if any, is as it was)."""
        positions = iter(range(1, len(params) + 1))
        prepare = (
            f"PREPARE {name} ({', '.join(_pg_type(value) for value in params)}) AS "
            + _PLACEHOLDER.sub(lambda _: f"${next(positions)}", query)
        )
        in_transaction = self.connection.info.transaction_status != TransactionStatus.IDLE
        try:
            if in_transaction:
                super().execute(f"SAVEPOINT tally_prepare;\n{prepare};\nRELEASE SAVEPOINT tally_prepare")
            else:
                super().execute(prepare)
        except psycopg.DatabaseError:
            if in_transaction and self.connection.info.transaction_status == TransactionStatus.INERROR:
                super().execute("ROLLBACK TO SAVEPOINT tally_prepare;\nRELEASE SAVEPOINT tally_prepare")
            return None
        return f"EXECUTE {name} ({', '.join(['%s'] * len(params))})"


def prepared_query_logged(cursor: Any, sql: Any, params: Any) -> str | None:
    """For Django's query log (`last_executed_query`): a registered statement that just
    went as EXECUTE is logged as its own SQL with its values, as it would be unprepared,
    so query logs and the tests reading them show the statement, not `EXECUTE tally_N`.
    None for anything else."""
    sent = getattr(getattr(cursor, "_query", None), "query", None)
    if not sent or not sent.startswith(b"EXECUTE tally_") or sql not in _REGISTERED:
        return None
    # On a cursor of its own: mogrify on the executing cursor would drop its results.
    with psycopg.ClientCursor(cursor.connection) as composing:
        return str(composing.mogrify(sql, params))


def prepared_statements_of(connection: Any) -> dict[str, str | None]:
    """What this psycopg connection has prepared (tests, benchmarks): SQL -> its EXECUTE."""
    return dict(_PREPARED.get(connection, {}))
