"""The durable floor for ingest: the least a server must do to accept a batch durably, as an ASGI app.

    PREFECT_WEBHOOKS_DATABASE_URL=sqlite:///... uvicorn --app-dir bench durable_floor:app

For each ``POST /v1/batch`` it parses the JSON body, builds for every call the same two rows the ingest API writes
(one outbox row with the call serialised as its body, its messageId remembered (``seen_ids``)), hands them to
a group commit on the event loop (the ingest API's scheme: what concurrent requests brought is written in one
transaction) and answers ``200`` once that transaction has committed. Nothing else: no authentication, validation,
timestamps, routing, deduplication or outbound body. It writes through the project's own store (same engine, same
SQLite pragmas or PostgreSQL pool, same ``insert_rows``), so the ratio of the ingest API to this floor is the share
of a durable write the rest of the API leaves.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.store.dedupe.seen_ids import remember_receipts
from prefect_webhooks.store.engine.engines import get_engine, insert_rows
from prefect_webhooks.store.schema.tables import OutboxMessage, store_now
from prefect_webhooks.utilities.runtime import tune_gc_for_serving  # noqa: E402

OUTBOX = OutboxMessage.__table__
MAX_GROUP_MESSAGES = 5000  # the ingest API's group size (BatchWriter.max_group_messages)
_OK = b'{"success":true}'


class GroupCommit:
    """Rows of concurrent requests written in one transaction, each request answered after the commit."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.waiting: list[tuple[list[dict], list[tuple], asyncio.Future]] = []
        self.flusher: asyncio.Task | None = None

    async def submit(self, outbox: list[dict], seen: list[tuple]) -> None:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((outbox, seen, future))
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self.flush())
        await future

    async def flush(self) -> None:
        await asyncio.sleep(0)
        while self.waiting:
            count, taken = 0, 0
            for outbox, _seen, _future in self.waiting:
                if taken and count + len(outbox) > MAX_GROUP_MESSAGES:
                    break
                count += len(outbox)
                taken += 1
            group, self.waiting = self.waiting[:taken], self.waiting[taken:]
            error = None
            try:
                with self.engine.begin() as connection:
                    remember_receipts(connection, "floor", [row for item in group for row in item[1]])
                    insert_rows(connection, OUTBOX, [row for item in group for row in item[0]])
            except Exception as exc:
                error = exc
            for _outbox, _seen, future in group:
                if not future.done():
                    future.set_exception(error) if error else future.set_result(None)
            await asyncio.sleep(0)


class FloorApp:
    """The ASGI app: ``POST /v1/batch`` → parse → two rows per call → group commit → ``200``."""

    def __init__(self) -> None:
        self.engine = get_engine(os.environ.get("PREFECT_WEBHOOKS_DATABASE_URL"))
        self.writer = GroupCommit(self.engine)
        tune_gc_for_serving()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        status = 200
        if scope["method"] == "POST":
            calls = orjson.loads(body)["batch"]
            now = store_now()
            outbox, seen = [], []
            for call in calls:
                outbox.append({"destination": "floor", "source": "floor", "message_type": call.get("type"),
                               "message_id": call.get("messageId"), "user_id": call.get("userId"),
                               "body": orjson.dumps(call), "state": PENDING, "attempts": 0, "created_at": now,
                               "next_attempt_at": now})
                seen.append((call.get("messageId"), now))
            try:
                await self.writer.submit(outbox, seen)
            except Exception:
                status = 503
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": _OK})


app = FloorApp()
