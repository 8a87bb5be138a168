"""The statement a lookup in the message log runs over a group of partitions, built once per group and filters.

A lookup reads a group of partitions with one compound select: per partition, its rows that match, newest first and
at most the limit (through its index), and of those the newest. The statement is written as SQL text: built as
SQLAlchemy objects and compiled, a union of 48 partitions cost 50-90 ms of Python, and a user's lookup meets a group
of partitions of its own (the sealed filters leave out the partitions it is not in), so a cache of built statements
missed on most users. Text costs microseconds per term; values are bound parameters, the text is cached as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.sql.elements import TextClause

from prefect_webhooks.store.log.partitions import STATE_CODES, partition_table
from prefect_webhooks.store.log.records import epoch_ms, text_key

# Each filter's condition in a term; the same parameter in every term.
_CONDITIONS = {
    "ids": "id IN :ids",
    "message_key": "message_key = :message_key",
    "user_key": "user_key = :user_key",
    "destination_id": "destination_id = :destination_id",
    "states": "state IN :states",
    "since_ms": "finished_ms >= :since_ms",
    "until_ms": "finished_ms < :until_ms",
}
_NEWEST_FIRST = "ORDER BY finished_ms DESC, id DESC"


def lookup_parameters(
    ids: Sequence[int] | None = None,
    message_id: str | None = None,
    user_id: str | None = None,
    destination_id: int | None = None,
    states: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """The values of the filters given, by parameter name (a filter not given is not in it)."""
    values = {
        "ids": list(ids) if ids is not None else None,
        "message_key": text_key(message_id) if message_id is not None else None,
        "user_key": text_key(user_id) if user_id is not None else None,
        "destination_id": destination_id,
        "states": [STATE_CODES[state] for state in states] if states else None,
        "since_ms": epoch_ms(since) if since is not None else None,
        "until_ms": epoch_ms(until) if until is not None else None,
        "limit": limit,
    }
    return {name: value for name, value in values.items() if value is not None}


@lru_cache(maxsize=512)
def group_statement(names: tuple[str, ...], filters: frozenset[str]) -> TextClause:
    """The newest matching rows of the partitions ``names`` (at most ``limit`` when it is a filter), each row with
    a ``partition`` column naming its partition."""
    where = " AND ".join(condition for name, condition in _CONDITIONS.items() if name in filters)
    limit = " LIMIT :limit" if "limit" in filters else ""
    columns = ", ".join(column.name for column in partition_table(names[0]).columns)  # every partition's
    terms = []
    for number, name in enumerate(names):
        term = f"SELECT {columns}, '{name}' AS \"partition\" FROM \"{name}\"{' WHERE ' + where if where else ''}"
        # A term of a compound select cannot order or limit itself: as a subquery it can.
        terms.append(f"SELECT * FROM ({term} {_NEWEST_FIRST}{limit}) AS term_{number}" if limit else term)
    statement = text(f"SELECT * FROM ({' UNION ALL '.join(terms)}) AS found {_NEWEST_FIRST}{limit}")
    expanding = [bindparam(name, expanding=True) for name in ("ids", "states") if name in filters]
    return statement.bindparams(*expanding) if expanding else statement
