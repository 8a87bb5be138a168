"""What the batches of one delivering process share, and how they reach the store.

``store_call`` runs a blocking store call in a thread and rides out a short store outage (a database restart), so
requests already sent are recorded instead of sent again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from prefect_webhooks.delivery.endpoints.shared_state import SharedState
from prefect_webhooks.delivery.endpoints.stats import DeliveryStats
from prefect_webhooks.delivery.pacing.retry_wakeups import RetryWakeups
from prefect_webhooks.delivery.sending.destinations import DestinationCache
from prefect_webhooks.delivery.sending.sender import Sender
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store.queue.outbox import Claimed

logger = logging.getLogger("prefect_webhooks.delivery")


class ClaimedBatch:
    """Rows claimed together; a plain object so Prefect passes it to the task without walking 500 bodies."""

    __slots__ = ("rows", "claimed_at", "lease_seconds", "due_by", "waiting")

    def __init__(
        self, rows: list[Claimed], lease_seconds: float | None = None, due_by: datetime | None = None
    ) -> None:
        self.rows = rows
        self.claimed_at = time.monotonic()
        """When the batch was made (just after its claim), on the monotonic clock."""
        self.lease_seconds = lease_seconds
        """The lease its claim took, when it was claimed just now; None when not known (re-read rows)."""
        self.due_by = due_by
        """The claim took rows due by this time (naive UTC; a claim made just before a retry falls due): each is sent
        at its due time. None: rows due at the claim."""
        self.waiting = False
        """Set once every message of the batch is on its way: the batch only waits for answers (and records them),
        and the claim loop no longer counts it against ``parallel_batches``."""

    def fresh(self, within: float) -> bool:
        """Whether the batch was claimed less than ``within`` seconds ago and a quarter of its lease: its rows are
        still held as claimed, whatever happened in the store meanwhile, except a deletion's purge."""
        if self.lease_seconds is None:
            return False
        return time.monotonic() - self.claimed_at < min(within, self.lease_seconds / 4)

    @property
    def ids(self) -> list[int]:
        """The outbox ids of the batch."""
        return [row.id for row in self.rows]

    def __repr__(self) -> str:
        return f"ClaimedBatch({len(self.rows)} messages)"


class DeliveryContext:
    """Everything batches of one delivering process share."""

    def __init__(
        self,
        engine: Engine,
        sender: Sender,
        *,
        owner: str | None = None,
        destinations: DestinationCache | None = None,
        settings: WebhooksSettings | None = None,
    ) -> None:
        self.engine = engine
        self.sender = sender
        self.owner = owner or new_owner()
        self.destinations = destinations or DestinationCache()
        self.settings = settings or get_settings()
        self.stats = DeliveryStats()
        self.key_prefix: str | None = None
        """``msg_<store key>_``: message ids are this plus the outbox id (read from the store once)."""
        self.shared = SharedState(engine)
        """Endpoint states and ordered destinations as this process last read them from the store."""
        self.retry_wakeups = RetryWakeups()
        """When the retries this process scheduled fall due: the claim loop claims them then."""
        self.sending: dict[int, set[int]] = {}
        """Each row a batch of this process holds, from its fence until its outcomes are recorded: that batch's rows."""
        self.claim_waker: Callable[[], None] | None = None
        """Set by the running claim loop: wakes it (``wake_claims``)."""

    def wake_claims(self) -> None:
        """Tell the claim loop that it may claim sooner than it planned: a batch only waits for answers now, or
        retries of this process were noted (``retry_wakeups``)."""
        if self.claim_waker is not None:
            self.claim_waker()

    def take_rows(self, ids: Iterable[int], held: set[int]) -> set[int]:
        """Add to ``held``, one batch's rows, those of ``ids`` no other batch of this process holds; returns them.

        The fence keeps a batch to the rows its process still leases. A lease that lapsed (the process stalled, or
        the store was out longer than the lease) lets this process's own next claim take the same rows again under
        the same owner, and that batch passes the fence too: this keeps them to the batch that took them first.
        """
        taken = {row_id for row_id in ids if self.sending.setdefault(row_id, held) is held}
        held |= taken
        return taken

    def open_to_claims(self, ids: Iterable[int], held: set[int]) -> None:
        """Let another batch of this process take ``ids`` once their record commits; ``held`` keeps them (and their
        lease renewed) until then.

        From that commit a retry already due can be claimed again by this process's claim loop, whose batch may
        reach its fence before the recording batch resumes: still in ``sending``, the row would be left to the batch
        that is done with it, and the new claim's lease would keep it from every claim for a lease.
        """
        for row_id in ids:
            if self.sending.get(row_id) is held:
                del self.sending[row_id]

    def give_up_rows(self, ids: Iterable[int], held: set[int]) -> None:
        """Remove ``ids`` from ``held`` (the batch gave them back to the outbox, or recorded their outcomes)."""
        for row_id in list(ids):
            if self.sending.get(row_id) is held:
                del self.sending[row_id]
            held.discard(row_id)

    def __repr__(self) -> str:
        return f"DeliveryContext(owner={self.owner!r})"

def new_owner() -> str:
    """A lease owner id unique to this process and run."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def is_store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached (restarting, connection lost, locked) — worth a retry."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


async def store_call(settings: WebhooksSettings, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking store call in a thread, retrying it while the store is unreachable.

    A restart of the database must not cost a batch whose requests were already sent (that would mean sending
    them again after the lease expires), so the call is retried with a growing pause for up to
    ``store_retry_seconds``; after that the error propagates and the rows wait for their lease to expire.
    """
    give_up_at = time.monotonic() + settings.delivery.store_retry_seconds
    pause = 0.2
    while True:
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except Exception as exc:
            if not is_store_unavailable(exc) or time.monotonic() + pause > give_up_at:
                raise
            logger.warning("store unavailable (%s); retrying in %.1f s", type(exc).__name__, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)
