"""The ingest API's single writer: the batches of concurrent requests committed together (group commit)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.engine import Engine

from prefect_webhooks.inbound.ingestion import IngestResult, PreparedBatch, commit_batches
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.schema.tables import OutboxMessage

logger = logging.getLogger(__name__)

# PostgreSQL: the ingest writer refreshes the planner's statistics at 10,000, 100,000 and 1,000,000 calls written.
ANALYZE_FIRST_AT = 10_000
ANALYZE_LAST_AT = 1_000_000


class OverloadedError(RuntimeError):
    """The writer has more calls waiting than ``ingest_max_pending``."""


_Item = tuple[PreparedBatch, asyncio.Future]


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return  # the request went away (client disconnect); its batch is committed all the same
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class BatchWriter:
    """The API's single writer: commits the batches of concurrent requests together (group commit).

    SQLite has one writer at a time, so one committer writing everything that is waiting in one transaction beats
    many small transactions. It runs on the event loop, between requests, not in a thread: measured on this
    machine, a writer thread spent most of its time waiting for the GIL (the sqlite3 driver releases and retakes
    it around every row while the loop thread parses requests), which cut throughput by more than half. Each
    request awaits its future, answered only after the commit. A group holds at most ``max_group_messages``
    calls; between groups the loop reads more requests.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_pending: int | None = None,
        max_group_messages: int = 5000,
    ) -> None:
        self.engine = engine
        self.max_pending = max_pending if max_pending is not None else get_settings().ingest.ingest_max_pending
        self.max_group_messages = max_group_messages
        self._waiting: list[_Item] = []
        self._pending = 0
        self._flusher: asyncio.Task | None = None
        self._written = 0
        self._analyze_at = ANALYZE_FIRST_AT

    @property
    def pending(self) -> int:
        """Calls handed to the writer and not yet committed."""
        return self._pending

    async def stop(self) -> None:
        """Write what is waiting."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def submit(self, batch: PreparedBatch) -> IngestResult:
        """Queue a batch and wait until it is committed.

        Raises:
            OverloadedError: too many calls are already waiting (answer 429).
            Exception: the store refused the transaction (answer 5xx).
        """
        size = len(batch.messages)
        if self._pending and self._pending + size > self.max_pending:
            raise OverloadedError(f"{self._pending} calls are waiting to be written")
        self._pending += size
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((batch, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    def _take_group(self) -> list[_Item]:
        count = 0
        taken = 0
        for batch, _future in self._waiting:
            if taken and count + len(batch.messages) > self.max_group_messages:
                break
            count += len(batch.messages)
            taken += 1
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return group

    async def _flush(self) -> None:
        # Let requests already being read finish parsing, so they join this group.
        await asyncio.sleep(0)
        while self._waiting:
            self._write(self._take_group())
            self._maybe_analyze()
            await asyncio.sleep(0)

    def _write(self, group: list[_Item]) -> None:
        error: BaseException | None = None
        results: list[IngestResult] = []
        try:
            with self.engine.begin() as connection:
                results = commit_batches(connection, [item[0] for item in group])
        except Exception as exc:  # answered to every request of the group as a 5xx
            logger.error("ingest write failed: %s", type(exc).__name__)
            error = exc
        finally:
            self._pending -= sum(len(item[0].messages) for item in group)
        if error is None:
            self._written += sum(result.accepted for result in results)
        for position, (_batch, future) in enumerate(group):
            _resolve(future, None if error else results[position], error)

    def _maybe_analyze(self) -> None:
        """PostgreSQL: refresh the planner's statistics while the tables are young (after 10,000, 100,000 and
        1,000,000 calls written by this process).

        On a new database the planner has no statistics on the queue yet; under a steady load autovacuum's first
        ANALYZE comes a minute or more later. (The dedupe lookup needs none: each period's key is unique, so its
        index is taken on any statistics.) Later statistics are autovacuum's business.
        """
        if self._written < self._analyze_at or self.engine.dialect.name != "postgresql":
            return
        self._analyze_at = self._analyze_at * 10 if self._analyze_at < ANALYZE_LAST_AT else float("inf")
        try:
            with self.engine.begin() as connection:
                connection.exec_driver_sql(f"ANALYZE {OutboxMessage.__tablename__}")
        except Exception as exc:
            logger.warning("refreshing the store's statistics failed: %s", type(exc).__name__)
