"""Statements straight to the database driver, in the caller's transaction.

For the few statements that run on every group commit or batch (the dedupe periods, whether anyone is suppressed,
the rows inserted on SQLite):
SQLAlchemy's execution of even a prepared statement (its execution context, the result's metadata) costs several
times a short query on SQLite. The statement goes to the DBAPI cursor of the connection the caller's transaction
holds, so it sees what the transaction has written, and a write among them still takes its turn at SQLite's write
gate (the cursor is the gated one). The statement is in the driver's own parameter style (``?`` on SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection


def _cursor(connection: Connection) -> Any:
    # As SQLAlchemy's own execution would: a connection outside a transaction begins one, which the caller's
    # ``commit()`` then ends (the driver's statement alone would leave SQLAlchemy thinking nothing was begun).
    if not connection.in_transaction():
        connection.begin()
    return connection.connection.cursor()


def driver_rows(connection: Connection, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Every row ``statement`` returns, run on the driver's cursor inside ``connection``'s transaction."""
    cursor = _cursor(connection)
    try:
        cursor.execute(statement, parameters)
        return cursor.fetchall()
    finally:
        cursor.close()


def driver_executemany(connection: Connection, statement: str, rows: Sequence[Sequence[Any]]) -> None:
    """``statement`` once for each of ``rows``, on the driver's cursor inside ``connection``'s transaction."""
    cursor = _cursor(connection)
    try:
        cursor.executemany(statement, rows)
    finally:
        cursor.close()
