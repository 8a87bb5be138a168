"""A deletion request in the message log: a user's personal data purged from the messages kept about them, and the
sources retention noted for the user when it dropped whole partitions of their messages (``retention``), so a
request that comes after still notifies every source it concerns.
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from prefect_webhooks.store.log.message_log import decode_rows
from prefect_webhooks.store.log.names import name_ids
from prefect_webhooks.store.log.partitions import kept_partitions
from prefect_webhooks.store.log.records import pack_record, text_key
from prefect_webhooks.store.schema.tables import LogName, UserSourceKey

NAMES = LogName.__table__
USER_SOURCE_KEYS = UserSourceKey.__table__


def purge_kept(connection: Connection, user_id: str) -> int:
    """Remove the user's personal data (body, user id, messageId) from every kept message about the user, in the
    caller's transaction; returns how many messages."""
    purged = 0
    key = text_key(user_id)
    for partition in kept_partitions(connection):
        table = partition.table
        for message in decode_rows(connection, connection.execute(select(table).where(
                table.c.user_key == key)).all(), partition):
            if message.content.user_id != user_id:
                continue
            content = message.content
            content.body = content.user_id = content.message_id = None
            codes = name_ids(connection, {attempt.url for attempt in content.tries})
            connection.execute(table.update().where(table.c.id == message.id).values(
                record=pack_record(content, message.finished_at, codes), user_key=None, message_key=None))
            purged += 1
    return purged


def pruned_sources(connection: Connection, user_id: str) -> set[str]:
    """The sources retention recorded for the user when it dropped partitions holding the user's messages."""
    query = (select(NAMES.c.name).join(USER_SOURCE_KEYS, USER_SOURCE_KEYS.c.source_id == NAMES.c.id)
             .where(USER_SOURCE_KEYS.c.user_key == text_key(user_id)))
    return set(connection.execute(query).scalars())


def forget_pruned_sources(connection: Connection, user_id: str) -> None:
    """Remove what ``pruned_sources`` finds for the user (a deletion request processed)."""
    connection.execute(delete(USER_SOURCE_KEYS).where(USER_SOURCE_KEYS.c.user_key == text_key(user_id)))


