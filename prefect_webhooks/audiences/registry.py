"""The audience registry: each audience's key (fixed at its first sync), name, kind, sources and last size.

A definition finds its audience by ``key`` when given (a rename), else by its current name; a new audience's key is
``snake_case(name)``, and a key already held by another audience is an error naming both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.audiences.definition import AudienceDefinition, AudienceError
from prefect_webhooks.audiences.naming import snake_case
from prefect_webhooks.store.schema.tables import Audience, AudienceState, store_now

AUDIENCES = Audience.__table__
STATE = AudienceState.__table__


@dataclass(frozen=True)
class RegisteredAudience:
    """An audience as the registry knows it."""

    key: str
    name: str
    kind: str
    member_count: int | None


def _registered(row: Any) -> RegisteredAudience:
    return RegisteredAudience(row.key, row.name, row.kind, row.member_count)


def find_audience(definition: AudienceDefinition, connection: Connection) -> tuple[str, RegisteredAudience | None]:
    """The key a definition maps to and its registry row (None when it is new); raises on a collision.

    Raises:
        AudienceError: The key belongs to an audience with another name, an explicit key is unknown, or the kind
            differs from the registered one.
    """
    columns = (AUDIENCES.c.key, AUDIENCES.c.name, AUDIENCES.c.kind, AUDIENCES.c.member_count)
    if definition.key is not None:
        row = connection.execute(select(*columns).where(AUDIENCES.c.key == definition.key)).first()
        if row is None and definition.key != snake_case(definition.name):
            raise AudienceError(f"no audience has key {definition.key!r}; a new audience's key is its snake_case name")
        key = definition.key
        namesake = connection.execute(
            select(AUDIENCES.c.key).where(AUDIENCES.c.name == definition.name, AUDIENCES.c.key != key)
        ).first()
        if namesake is not None:
            # Names find audiences (a definition without key): two audiences must not share one.
            raise AudienceError(
                f"cannot name audience {key!r} {definition.name!r}: audience {namesake.key!r} already has that name"
            )
    else:
        row = connection.execute(select(*columns).where(AUDIENCES.c.name == definition.name)).first()
        key = row.key if row is not None else snake_case(definition.name)
        if row is None:
            row = connection.execute(select(*columns).where(AUDIENCES.c.key == key)).first()
            # The same name found by key: a concurrent sync created this audience between the two reads.
            if row is not None and row.name != definition.name:
                raise AudienceError(
                    f"audience {definition.name!r} would have key {key!r}, which audience {row.name!r} already has; "
                    "choose another name"
                )
    found = _registered(row) if row is not None else None
    if found is not None and found.kind != definition.kind:
        raise AudienceError(f"audience {found.name!r} ({key!r}) is a {found.kind}, not a {definition.kind}")
    return key, found


def save_audience(
    definition: AudienceDefinition, key: str, existing: RegisteredAudience | None, engine: Engine
) -> None:
    """Create the registry row, or update the name (rename) and sources of an existing one."""
    now = store_now()
    with engine.begin() as connection:
        if existing is None:
            statement = (sqlite_insert if connection.dialect.name == "sqlite" else postgresql_insert)(AUDIENCES)
            created = connection.execute(
                statement.values(
                    key=key,
                    name=definition.name,
                    kind=definition.kind,
                    sources=definition.sources,
                    created_at=now,
                    updated_at=now,
                ).on_conflict_do_nothing()
            ).rowcount
            if not created:
                # Created by a concurrent run meanwhile: fine if it is the same audience, a collision otherwise.
                row = connection.execute(select(AUDIENCES.c.name, AUDIENCES.c.kind).where(AUDIENCES.c.key == key)).one()
                if (row.name, row.kind) != (definition.name, definition.kind):
                    raise AudienceError(
                        f"audience {definition.name!r} would have key {key!r}, which audience {row.name!r} already "
                        "has; choose another name"
                    )
        else:
            connection.execute(
                update(AUDIENCES)
                .where(AUDIENCES.c.key == key)
                .values(name=definition.name, sources=definition.sources, updated_at=now)
            )


def previously_non_empty(key: str, existing: RegisteredAudience | None, connection: Connection) -> bool:
    """Whether an earlier sync of the audience had members (its count, or any state left by a partial run)."""
    if existing is None:
        return False
    if existing.member_count:
        return True
    return bool(connection.execute(select(exists().where(STATE.c.audience_key == key))).scalar())


def record_members(key: str, members: int, engine: Engine) -> None:
    """Remember the size of the last completed sync (the empty-snapshot guard reads it)."""
    with engine.begin() as connection:
        connection.execute(
            update(AUDIENCES).where(AUDIENCES.c.key == key)
            .values(member_count=members, last_synced_at=store_now(), updated_at=store_now())
        )
