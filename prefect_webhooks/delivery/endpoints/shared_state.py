"""What a delivering process last read of the state its peers share in the store, kept for about a second.

Endpoint states (pauses, ramps, limits, failure runs), the set of ordered destinations and the destinations' block
generations (``store.endpoints.destination_changes``) change rarely; reading them once a second instead of once per
batch keeps a healthy endpoint's batches free of extra store queries. A process that changes one of them itself marks
its copy stale, so its next batch reads the change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy.engine import Engine

from prefect_webhooks.store.endpoints.destination_changes import destination_generations
from prefect_webhooks.store.endpoints.states import read_states
from prefect_webhooks.store.queue.ordering import ordered_destinations

logger = logging.getLogger("prefect_webhooks.delivery")
REFRESH_SECONDS = 1.0


class SharedState:
    """A process's copy of the endpoint states of the destinations it delivers to, and of the ordered set."""

    def __init__(self, engine: Engine, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.engine = engine
        self.refresh_seconds = refresh_seconds
        self._states: dict[tuple[str, str], Any] = {}
        self._names: set[str] = set()
        self._ordered: set[str] = set()
        self._generations: dict[str, int] = {}
        self._read_at = -float("inf")

    def mark_stale(self) -> None:
        """Read again at the next call (this process changed something)."""
        self._read_at = -float("inf")

    async def refresh(self, destinations: Iterable[str]) -> None:
        """Read the store again when the copy is older than ``refresh_seconds`` or lacks a destination."""
        names = set(destinations)
        if time.monotonic() - self._read_at < self.refresh_seconds and names <= self._names:
            return
        names |= self._names
        try:
            states, ordered, generations = await asyncio.to_thread(self._read, names)
        except Exception as exc:
            # Only a shortcut: rate limits and order are still enforced by the store; pauses are seen a bit later.
            logger.warning("reading endpoint states failed: %s", type(exc).__name__)
            return
        self._states, self._ordered, self._names, self._read_at = states, ordered, names, time.monotonic()
        self._generations = generations

    def _read(self, names: set[str]) -> tuple[dict[tuple[str, str], Any], set[str], dict[str, int]]:
        return (read_states(self.engine, names), ordered_destinations(self.engine),
                destination_generations(self.engine, names))

    def generation(self, destination: str) -> int | None:
        """How many changes the store counted for ``destination``'s block (as last read); None: none ever."""
        return self._generations.get(destination)

    def endpoint(self, destination: str, key: str) -> Any | None:
        """The endpoint's row as last read, or None."""
        return self._states.get((destination, key))

    def is_ordered(self, destination: str) -> bool:
        """Whether the store lists ``destination`` as ordered (as last read)."""
        return destination in self._ordered

    def may_be_ordered(self) -> bool:
        """Whether a claim must apply the ordered-delivery rule: some destination was listed as ordered at the last
        read (or nothing was read yet). A destination switched meanwhile is caught by the batch's re-check."""
        return self._read_at == -float("inf") or bool(self._ordered)

    def note_ordered(self, destination: str, ordered: bool) -> None:
        """Remember a change this process made to the ordered set."""
        (self._ordered.add if ordered else self._ordered.discard)(destination)
