"""Many rows of one shape into a table, in the caller's transaction, at the cost of the insert itself."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, insert
from sqlalchemy.engine import Connection

from prefect_webhooks.store.schema.driver import driver_executemany
from prefect_webhooks.store.schema.tables import store_time_text


def insert_rows(connection: Connection, table: Any, rows: Sequence[dict[str, Any]]) -> int:
    """Insert many rows of one shape into ``table`` in the caller's transaction; returns how many.

    On SQLite the rows go straight to the driver's ``executemany``: SQLAlchemy's per-row parameter processing
    (compiling each row's parameters, converting each datetime) cost more than the insert itself at 10,000+
    calls/s and more than half of a million-member audience sync. Other databases get the portable core ``insert``.
    """
    if not rows:
        return 0
    if connection.dialect.name != "sqlite":
        connection.execute(insert(table), list(rows))
        return len(rows)
    columns = list(rows[0])
    statement = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    times = [i for i, column in enumerate(columns) if isinstance(table.c[column].type, DateTime)]
    values = operator.itemgetter(*columns)
    formatted: dict[datetime, str] = {}
    parameters = []
    for row in rows:
        row_values = list(values(row)) if len(columns) > 1 else [values(row)]
        for i in times:
            moment = row_values[i]
            if moment is not None:
                text = formatted.get(moment)
                if text is None:
                    # SQLAlchemy's own SQLite DATETIME text, so every reader parses and compares it the same way.
                    text = formatted[moment] = store_time_text(moment)
                row_values[i] = text
        parameters.append(tuple(row_values))
    driver_executemany(connection, statement, parameters)
    return len(rows)
