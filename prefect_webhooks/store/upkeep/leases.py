"""Named leases in the store: one process at a time runs a piece of maintenance (a pruning pass), on SQLite and on
PostgreSQL alike, across hosts.

A lease is a row (``store_leases``) taken with one conditional upsert: free or expired, it becomes the caller's;
held by someone else, nothing changes. The holder renews it while working and releases it at the end; a holder
that was killed simply lets it expire.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, or_
from sqlalchemy.engine import Engine

from prefect_webhooks.store.schema.tables import StoreLease, dialect_insert, store_now

LEASES = StoreLease.__table__


def take_lease(engine: Engine, name: str, owner: str, seconds: float) -> bool:
    """Take (or renew, for its holder) the lease ``name`` for ``seconds``; False when another owner holds it."""
    now = store_now(engine)  # the database's clock on PostgreSQL: hosts whose clocks disagree still take turns
    with engine.begin() as connection:
        statement = dialect_insert(connection)(LEASES).values(
            name=name, owner=owner, expires_at=now + timedelta(seconds=seconds))
        taken = connection.execute(statement.on_conflict_do_update(
            index_elements=[LEASES.c.name],
            set_={"owner": statement.excluded.owner, "expires_at": statement.excluded.expires_at},
            where=or_(LEASES.c.expires_at < now, LEASES.c.owner == owner),
        ).returning(LEASES.c.name)).first()
    # (rowcount is not reported for an upsert by every driver: the returned row says whether it was written.)
    return taken is not None


def release_lease(engine: Engine, name: str, owner: str) -> None:
    """Give the lease up if ``owner`` still holds it."""
    with engine.begin() as connection:
        connection.execute(delete(LEASES).where(LEASES.c.name == name, LEASES.c.owner == owner))
