"""Audiences and computed traits: the sync (registry in ``audience_registry``, diff in ``audience_diff``) and its
one-transaction write per destination.

How an audience is defined: an ``AudienceDefinition`` (pydantic) is passed to the ``audience_sync`` flow. On its
first sync it is registered in the ``audiences`` table under ``key = snake_case(name)`` (see ``naming``); the key
never changes after that.

- Rename: pass the existing ``key`` with the new ``name``; the row's name changes, the key (the property name the
  receivers see) does not. A definition without ``key`` whose ``name`` is an audience's current name is that audience.
- Collision: a new name whose key is already used by another audience is an error naming both.
- Kind: ``audience`` (membership, values ``true``/``false``) or ``computed_trait`` (a value column); the kind of a
  registered audience cannot change.

Who receives it: each name in ``sources`` is a ``Source`` block; every WebhookDestination block named in its
``destinations`` receives the audience once (a destination enabled on two of the sources is synced once, under the
first source that names it, which is also the outbox row's ``source``). ``Source.enabled`` governs ingestion only.

Diff (per destination, against ``audience_state``: the last value that reached the outbox for that destination):

- first sync for a destination → an ``identify`` for every member, ``traits = {key: true}`` (or the trait value);
- later → added members ``{key: true}``, removed members ``{key: false}``; for a computed trait, new or changed
  values ``{key: value}``, and a user gone from the trait snapshot ``{key: null}`` (the trait no longer applies);
- a removed user's state row is deleted (state holds current members/values only);
- users suppressed by a deletion request (``suppressed_users`` for ``*`` or the destination's source) are left out.

The identify rows and the state changes of one destination are written in one transaction that starts by taking
the write lock (``BEGIN IMMEDIATE`` on SQLite, a row lock on the audience on PostgreSQL) and reads the state inside
it: a crash anywhere loses nothing and repeats nothing, and two syncs of the same audience cannot interleave.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import orjson
from pydantic import BaseModel
from sqlalchemy import or_, select
from sqlalchemy.engine import Connection, Engine

# AudienceError is raised by sync_audience: callers import it from here.
from prefect_webhooks.audiences.definition import AudienceDefinition
from prefect_webhooks.audiences.definition import AudienceError as AudienceError
from prefect_webhooks.audiences.diff import SnapshotDiff, diff_snapshot, read_state
from prefect_webhooks.audiences.registry import (
    AUDIENCES,
    RegisteredAudience,
    find_audience,
    previously_non_empty,
    record_members,
    save_audience,
)
from prefect_webhooks.audiences.snapshots import SnapshotError, load_snapshot, reading_for, validate_snapshot
from prefect_webhooks.messages.payloads import identify_payload
from prefect_webhooks.messages.timestamps import utcnow
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows
from prefect_webhooks.store.schema.tables import AudienceState, SuppressedUser, to_store_time

if TYPE_CHECKING:
    import pandas as pd

STATE = AudienceState.__table__
SUPPRESSED = SuppressedUser.__table__
CHUNK_ROWS = 20_000
MEMBER = "true"

Progress = Callable[[float], None]


class DestinationResult(BaseModel):
    """The outcome of one sync for one destination."""

    destination: str
    source: str
    members: int
    added: int
    removed: int
    changed: int
    unchanged: int
    queued: int


class SyncResult(BaseModel):
    """The outcome of one audience sync."""

    key: str
    name: str
    kind: str
    members: int
    destinations: list[DestinationResult]


# --- targets and suppression -----------------------------------------------------------------------------------


def destination_sources(sources: Sequence[str], destinations_of: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each destination the audience reaches, mapped to the first of ``sources`` that enables it.

    Args:
        sources: The audience's Source block names, in order.
        destinations_of: Each source's enabled WebhookDestination block names.
    """
    targets: dict[str, str] = {}
    for source in sources:
        for destination in destinations_of.get(source, ()):
            targets.setdefault(destination, source)
    return targets


def suppressed_users(connection: Connection, source: str) -> set[str]:
    """Users whose data must not be sent for ``source`` (suppressed for it or for every source)."""
    rows = connection.execute(select(SUPPRESSED.c.user_id).where(or_(SUPPRESSED.c.source == "*",
                                                                      SUPPRESSED.c.source == source)))
    return {row[0] for row in rows}


# --- the write -------------------------------------------------------------------------------------------------


def lock_audience(connection: Connection, key: str) -> None:
    """Take the write lock before reading state, so the diff and the write see the same state."""
    if connection.dialect.name == "sqlite":
        # pysqlite would only BEGIN at the first write; the state read must be inside the same transaction.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        connection.execute(select(AUDIENCES.c.key).where(AUDIENCES.c.key == key).with_for_update())


Change = tuple[str, str, "str | None"]


def write_changes(
    connection: Connection,
    changes: Sequence[Change],
    *,
    key: str,
    destination: str,
    source: str,
    timestamp: datetime,
) -> int:
    """Queue one chunk's identify messages and record the state they carry, in the caller's transaction.

    Args:
        connection: A connection inside the sync's transaction.
        changes: ``(user_id, JSON value sent, JSON value kept as state or None to delete the state row)``.
        key: Audience key (the trait name in the messages).
        destination: WebhookDestination block name.
        source: Source block name written on the outbox rows.
        timestamp: The sync's time, on every message.

    Returns:
        The number of outbox rows written.
    """
    # The shape comes from identify_payload once per chunk; formatting the same timestamp per row cost ~3 µs each.
    template = identify_payload("", {}, timestamp)
    payloads = [{**template, "userId": user, "traits": {key: orjson.loads(sent)}} for user, sent, _ in changes]
    queued = add_to_outbox(connection, outbox_rows(destination, payloads, source=source, now=timestamp))
    write_state(connection, changes, key=key, destination=destination)
    return queued


def _placeholder(connection: Connection) -> str:
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def write_state(connection: Connection, changes: Sequence[Change], *, key: str, destination: str) -> None:
    """Upsert the new values and delete the rows of users who left, as executemany statements.

    The driver's ``executemany`` on the transaction's own connection: SQLAlchemy's per-row parameter processing
    cost more than the inserts themselves. ``ON CONFLICT … DO UPDATE`` is the same on SQLite and PostgreSQL.
    """
    mark = _placeholder(connection)
    upserts = [(key, destination, user, kept) for user, _, kept in changes if kept is not None]
    deletions = [(key, destination, user) for user, _, kept in changes if kept is None]
    cursor = connection.connection.cursor()
    try:
        if upserts:
            cursor.executemany(
                f"INSERT INTO {STATE.name} (audience_key, destination, user_id, value) "  # noqa: S608
                f"VALUES ({mark}, {mark}, {mark}, {mark}) "
                "ON CONFLICT (audience_key, destination, user_id) DO UPDATE SET value = excluded.value",
                upserts,
            )
        if deletions:
            cursor.executemany(
                f"DELETE FROM {STATE.name} "  # noqa: S608
                f"WHERE audience_key = {mark} AND destination = {mark} AND user_id = {mark}",
                deletions,
            )
    finally:
        cursor.close()


def change_list(diff: SnapshotDiff, kind: str) -> list[Change]:
    """The diff as changes: additions and new values kept as state; leavers sent ``false`` (audience) or ``null``
    (trait) and their state row deleted."""
    added_values = diff.added["value"].tolist() if "value" in diff.added else [MEMBER] * len(diff.added)
    changes: list[Change] = [(user, value, value)
                             for user, value in zip(diff.added["user_id"].tolist(), added_values, strict=True)]
    if len(diff.changed):
        changes.extend((user, value, value) for user, value in
                       zip(diff.changed["user_id"].tolist(), diff.changed["value"].tolist(), strict=True))
    gone = "false" if kind == "audience" else "null"
    changes.extend((user, gone, None) for user in diff.removed.tolist())
    return changes


def sync_destination(
    snapshot: pd.DataFrame,
    *,
    audience: RegisteredAudience,
    destination: str,
    source: str,
    engine: Engine,
    timestamp: datetime,
    progress: Progress | None = None,
) -> DestinationResult:
    """Diff the snapshot against one destination's state and write messages + state in one transaction."""
    with engine.begin() as connection:
        lock_audience(connection, audience.key)
        suppressed = suppressed_users(connection, source)
        members = snapshot[~snapshot["user_id"].isin(suppressed)] if suppressed else snapshot
        state = read_state(connection, audience.key, destination, with_values="value" in snapshot.columns)
        diff = diff_snapshot(members, state)
        changes = change_list(diff, audience.kind)
        queued = 0
        for start in range(0, len(changes), CHUNK_ROWS):
            chunk = changes[start:start + CHUNK_ROWS]
            queued += write_changes(connection, chunk, key=audience.key, destination=destination, source=source,
                                    timestamp=timestamp)
            if progress:
                progress((start + len(chunk)) / len(changes))
        if diff.restated is not None and len(diff.restated):
            values = diff.restated["value"].tolist()
            write_state(connection, list(zip(diff.restated["user_id"].tolist(), values, values, strict=True)),
                        key=audience.key, destination=destination)
    return DestinationResult(
        destination=destination,
        source=source,
        members=len(members),
        added=len(diff.added),
        removed=len(diff.removed),
        changed=len(diff.changed),
        unchanged=diff.unchanged,
        queued=queued,
    )


def prepare_snapshot(definition: AudienceDefinition, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Load (unless given) and validate the definition's snapshot; raises ``SnapshotError``."""
    columns = [definition.id_column] + ([definition.value_column] if definition.value_column else [])
    raw = frame if frame is not None else load_snapshot(definition.snapshot, columns)
    return validate_snapshot(raw, definition.id_column, definition.value_column,
                             definition.value_type if definition.value_column else None,
                             reading=reading_for(definition.snapshot) if frame is None else "typed")


def sync_audience(
    definition: AudienceDefinition,
    destinations_of: Mapping[str, Sequence[str]],
    *,
    allow_empty: bool = False,
    engine: Engine | None = None,
    timestamp: datetime | None = None,
    progress: Progress | None = None,
) -> SyncResult:
    """Sync one audience or computed trait to every Webhooks destination of its sources.

    Args:
        definition: The audience.
        destinations_of: Each of the definition's sources mapped to its enabled WebhookDestination block names
            (the flow reads them from the Source blocks).
        allow_empty: Accept an empty snapshot even though the last sync had members (removes everyone).
        engine: The store; the configured one by default.
        timestamp: Time written on the messages; now by default.
        progress: Called with a fraction in [0, 1] as the work advances.

    Returns:
        Per-destination counts.

    Raises:
        AudienceError: A key collision or a kind change; nothing is written.
        SnapshotError: A bad snapshot, or an unexpected empty one; nothing is written.
    """
    engine = engine or get_engine()
    timestamp = timestamp or utcnow()
    with engine.connect() as connection:
        key, existing = find_audience(definition, connection)
    snapshot = prepare_snapshot(definition)
    _report(progress, 0.1)
    if snapshot.empty and not allow_empty:
        with engine.connect() as connection:
            if previously_non_empty(key, existing, connection):
                raise SnapshotError(
                    f"the snapshot of {definition.name!r} is empty but the last sync had members; "
                    "refusing to remove everyone (run with allow_empty=True if this is intended)"
                )
    save_audience(definition, key, existing, engine)
    audience = RegisteredAudience(key, definition.name, definition.kind, existing.member_count if existing else None)
    targets = destination_sources(definition.sources, destinations_of)
    results = []
    for index, (destination, source) in enumerate(targets.items()):
        def step(fraction: float, index: int = index) -> None:
            _report(progress, 0.1 + 0.9 * (index + fraction) / len(targets))

        results.append(sync_destination(snapshot, audience=audience, destination=destination, source=source,
                                        engine=engine, timestamp=to_store_time(timestamp), progress=step))
    record_members(key, len(snapshot), engine)
    _report(progress, 1.0)
    return SyncResult(key=key, name=definition.name, kind=definition.kind, members=len(snapshot),
                      destinations=results)


def _report(progress: Progress | None, fraction: float) -> None:
    if progress:
        progress(fraction)
