"""Whether the suite's database connection goes through a pooler (PgBouncer,
devtools/pgbouncer.py), and the server session behind it.

Behind PgBouncer the backend pid a client is told at login is the pooler's own key, not a
server process, and a server session outlives the client session that used it (session
mode keeps it in the pool for the next client). Tests that watch server sessions
(pg_stat_activity, pg_terminate_backend) ask the server for its pid."""

from __future__ import annotations

from django.db import connection


def server_pid() -> int:
    """The pid of the server session the default connection's statements run on."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    return int(row[0])


def behind_a_pooler() -> bool:
    connection.ensure_connection()
    return bool(connection.connection.info.backend_pid != server_pid())
