"""Block changes every delivering process hears of within a second, whatever its block cache.

A process keeps each destination block for ``PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS``. A change a user expects to act at
once (``endpoint enable`` and ``disable``, a rotated secret, an endpoint delivery disabled) also counts up the
destination's generation in the store; delivery reads the generations with the endpoint states it reads every second
(``delivery.endpoints.shared_state``), and a process that sees a generation it has not seen drops its copy of that
block. A change saved elsewhere (the Prefect UI, a script) is seen when the copy ages out, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from prefect_webhooks.store.schema.tables import DestinationChange, dialect_insert

CHANGES = DestinationChange.__table__


def note_destination_changed(engine: Engine, destination: str) -> None:
    """Count up ``destination``'s generation: every delivering process reads its block again."""
    with engine.begin() as connection:
        connection.execute(dialect_insert(connection)(CHANGES).values(destination=destination, generation=0)
                           .on_conflict_do_nothing())
        connection.execute(update(CHANGES).where(CHANGES.c.destination == destination)
                           .values(generation=CHANGES.c.generation + 1))


def destination_generations(engine: Engine, destinations: Iterable[str]) -> dict[str, int]:
    """The generations of those of ``destinations`` a change was ever noted for."""
    names = sorted(set(destinations))
    if not names:
        return {}
    with engine.connect() as connection:
        rows = connection.execute(select(CHANGES.c.destination, CHANGES.c.generation)
                                  .where(CHANGES.c.destination.in_(names)))
        return {row.destination: row.generation for row in rows}
