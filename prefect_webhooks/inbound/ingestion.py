"""The one ingestion path: raw calls in, outbox rows out. Used by the ingest API and by the ingest flow.

A batch goes through two steps:

1. ``prepare_batch`` (CPU only, no store): merge the batch-level ``context``/``integrations``/``sentAt`` into each
   call, check its size, validate it (``messages.parse_message``), resolve its timestamp, route it
   (``routing.route``) and build its outbound rows (``payloads`` + ``outbox.outbox_rows``).
2. ``commit_batches`` (inside one transaction): drop duplicates of a messageId seen from the same source within the
   dedupe window (``store.dedupe.seen_ids``), drop calls about suppressed users (``SuppressedUser``), write the rest.

``ingest_batch`` does both in one transaction; ``batch_writer.BatchWriter`` is the API's single writer (on the event
loop): it commits the batches of concurrent requests together (group commit) and answers each request after the
commit. The request body's batch-level fields are read in ``envelope``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.inbound.envelope import EnvelopeError, merge_batch_fields
from prefect_webhooks.inbound.routing import call_integrations, route
from prefect_webhooks.inbound.sources import SourceInfo
from prefect_webhooks.messages.model import MAX_MESSAGE_BYTES, Alias, BaseMessage, MessageError, parse_message
from prefect_webhooks.messages.payloads import outbound_payload
from prefect_webhooks.messages.timestamps import TimestampError, parse_timestamp
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.dedupe.seen_ids import remember_receipts, seen_receipts
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_row
from prefect_webhooks.store.schema.driver import driver_rows
from prefect_webhooks.store.schema.tables import SuppressedUser, store_now, to_store_time

ALL_SOURCES = "*"
# SQLite allows 999 bound parameters per statement in old builds; stay well under it.
_IN_CHUNK = 400
_SUPPRESSED = SuppressedUser.__table__


class Rejection(BaseModel):
    """A call refused on its own inside an accepted batch."""

    index: int = Field(description="Position of the call in the batch (0-based).")
    field: str = Field(description="Wire name of the offending field.")
    reason: str = Field(description="Why the call was refused.")


class IngestResult(BaseModel):
    """What happened to a batch."""

    accepted: int = Field(default=0, description="Calls accepted (new, not suppressed), whatever their routing.")
    duplicates: int = Field(default=0, description="Calls dropped as a repeat of a messageId inside the window.")
    suppressed: int = Field(default=0, description="Calls dropped because their user is suppressed.")
    rejected: list[Rejection] = Field(default_factory=list, description="Calls refused, with index and reason.")
    rows_written: int = Field(default=0, description="Outbox rows written (one per call and destination).")


@dataclass
class PreparedMessage:
    """A valid call, ready to be written: its dedupe key, the users it is about, and its outbox rows."""

    index: int
    message_id: str
    users: tuple[str, ...]
    rows: list[dict[str, Any]]


@dataclass
class PreparedBatch:
    """A batch after validation and routing, before dedupe, suppression and the write."""

    source: SourceInfo
    received_at: datetime
    messages: list[PreparedMessage] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)


def resolve_timestamp(message: BaseMessage, received_at: datetime) -> datetime:
    """The event time, corrected for the client's clock.

    The client's time is ``timestamp`` or else ``originalTimestamp``; without one the event happened at
    ``received_at``. With ``sentAt`` the client's clock offset is removed: ``received_at − (sentAt − client time)``
    (historical times keep their distance to ``sentAt``). Without ``sentAt`` the client's time is kept as is.
    """
    client_time = message.timestamp or message.original_timestamp
    if client_time is None:
        return received_at
    if message.sent_at is None:
        return client_time
    try:
        return received_at - (message.sent_at - client_time)
    except OverflowError:
        # e.g. sentAt in year 9999 and timestamp in year 1: the corrected time is not a date.
        raise MessageError("sentAt", "sentAt and the call's time are too far apart to correct the clock") from None


def message_size(raw: Any) -> int:
    """Bytes of the call as compact JSON (the 32 KB limit applies to this)."""
    return len(orjson.dumps(raw, default=str))


def _suppression_keys(message: BaseMessage) -> tuple[str, ...]:
    if isinstance(message, Alias):
        return (message.user_id, message.previous_id)
    return (message.user_id,) if message.user_id else ()


def prepare_message(
    raw: dict[str, Any],
    index: int,
    source: SourceInfo,
    received_at: datetime,
    stored_at: datetime | None = None,
) -> PreparedMessage:
    """Validate one merged call and build its outbox rows (``stored_at``: ``received_at`` as store time).

    Raises:
        MessageError: the call breaks a rule.
    """
    if not raw.get("messageId"):
        raw["messageId"] = str(uuid.uuid4())
    message = parse_message(raw)
    payload = outbound_payload(message, resolve_timestamp(message, received_at))
    destinations = route(call_integrations(message.integrations, message.context), source.destinations)
    rows: list[dict[str, Any]] = []
    if destinations:
        # The body is serialised once and shared by every destination's row.
        first = outbox_row(destinations[0], payload, source=source.name, message_id=message.message_id,
                           stored_at=stored_at or to_store_time(received_at))
        rows = [first, *({**first, "destination": name} for name in destinations[1:])]
    return PreparedMessage(index, message.message_id, _suppression_keys(message), rows)


def prepare_batch(
    raw_messages: Sequence[Any],
    source: SourceInfo,
    *,
    context: dict[str, Any] | None = None,
    integrations: dict[str, Any] | None = None,
    sent_at: Any = None,
    received_at: datetime | None = None,
    oversize: Literal["raise", "reject"] = "raise",
    first_index: int = 0,
) -> PreparedBatch:
    """Validate, time and route every call of a batch (no store access).

    Args:
        raw_messages: Calls in wire form (dicts).
        source: The source they came from.
        context: Batch-level context merged into each call.
        integrations: Batch-level integrations merged into each call.
        sent_at: Batch-level ``sentAt`` used by calls without their own.
        received_at: Server time of receipt (now by default).
        oversize: ``"raise"`` refuses the whole batch for a call over 32 KB (the API); ``"reject"`` rejects only
            that call (bulk imports).
        first_index: Index of the first call, for rejections of a chunk of a longer input.

    Raises:
        EnvelopeError: a call is over 32 KB and ``oversize`` is ``"raise"``.
    """
    # The store's clock (the database's on PostgreSQL): the receipt's dedupe period and the rows' due time agree
    # across hosts whose clocks do not.
    received_at = received_at or store_now().replace(tzinfo=timezone.utc)
    if sent_at is not None:
        try:
            # Parsed once for the batch: each call without its own sentAt gets the parsed time.
            sent_at = parse_timestamp(sent_at)
        except TimestampError as exc:
            raise EnvelopeError("invalid_batch", f"batch-level sentAt: {exc}") from None
    batch = PreparedBatch(source=source, received_at=received_at)
    stored_at = to_store_time(received_at)
    for offset, raw in enumerate(raw_messages):
        index = first_index + offset
        try:
            size = message_size(raw)
        except TypeError as exc:
            # What JSON cannot carry (integers past 64 bits, non-string keys) can only come from Python callers of
            # the bulk-ingest flow (the API's parser refuses it first); orjson says which, without the value.
            batch.rejected.append(Rejection(index=index, field="message", reason=f"not representable as JSON: {exc}"))
            continue
        if size > MAX_MESSAGE_BYTES:
            reason = f"message at index {index} is {size} bytes; the limit is {MAX_MESSAGE_BYTES}"
            if oversize == "raise":
                raise EnvelopeError("message_too_large", reason)
            batch.rejected.append(Rejection(index=index, field="message", reason=reason))
            continue
        if not isinstance(raw, dict):
            batch.rejected.append(
                Rejection(index=index, field="message", reason=f"must be a JSON object, got {type(raw).__name__}")
            )
            continue
        try:
            merged = merge_batch_fields(raw, context, integrations, sent_at)
            batch.messages.append(prepare_message(merged, index, source, received_at, stored_at))
        except MessageError as exc:
            batch.rejected.append(Rejection(index=index, field=exc.field, reason=exc.reason))
        except TypeError as exc:
            # The batch-level context or integrations merged in may hold what JSON cannot carry (see above).
            batch.rejected.append(Rejection(index=index, field="message", reason=f"not representable as JSON: {exc}"))
    return batch


def _chunks(values: Sequence[str], size: int = _IN_CHUNK) -> Iterable[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


# Asked in every group commit (nearly always: no): plain SQL straight to the driver, which both stores take as is;
# built and run through SQLAlchemy it was a fifth of the commit of a one-call request.
_ANY_SUPPRESSED = f"SELECT 1 FROM {_SUPPRESSED.name} LIMIT 1"


def _any_suppressed(connection: Connection) -> bool:
    return bool(driver_rows(connection, _ANY_SUPPRESSED))


def _suppressed(connection: Connection, source: str, users: set[str]) -> set[str]:
    if not users:
        return set()
    found: set[str] = set()
    for chunk in _chunks(sorted(users)):
        query = select(_SUPPRESSED.c.user_id).where(
            _SUPPRESSED.c.source.in_((source, ALL_SOURCES)), _SUPPRESSED.c.user_id.in_(chunk)
        )
        found.update(connection.execute(query).scalars())
    return found


def _commit_source(
    connection: Connection, source: str, batches: Sequence[PreparedBatch], window: timedelta
) -> list[IngestResult]:
    """Dedupe, suppress and write the batches of one source, in order; results in the same order."""
    since = min(to_store_time(batch.received_at) for batch in batches) - window
    seen = seen_receipts(connection, source, [m.message_id for b in batches for m in b.messages], since)
    suppressed = (
        _suppressed(connection, source, {user for b in batches for m in b.messages for user in m.users})
        if _any_suppressed(connection) else set()
    )
    new_seen: list[tuple[str, datetime]] = []
    rows: list[dict[str, Any]] = []
    results = []
    for batch in batches:
        accepted = duplicates = dropped = written = 0
        received = to_store_time(batch.received_at)
        cutoff = received - window
        for message in batch.messages:
            previous = seen.get(message.message_id)
            if previous is not None and previous >= cutoff:
                duplicates += 1
                continue
            seen[message.message_id] = received
            new_seen.append((message.message_id, received))
            if suppressed and suppressed.intersection(message.users):
                dropped += 1
                continue
            accepted += 1
            written += len(message.rows)
            rows.extend(message.rows)
        results.append(
            IngestResult(
                accepted=accepted, duplicates=duplicates, suppressed=dropped, rejected=batch.rejected,
                rows_written=written,
            )
        )
    remember_receipts(connection, source, new_seen)
    add_to_outbox(connection, rows)
    return results


def commit_batches(
    connection: Connection, batches: Sequence[PreparedBatch], *, window_seconds: float | None = None
) -> list[IngestResult]:
    """Write prepared batches inside the caller's transaction; one result per batch, in order.

    A messageId already accepted from the same source within ``window_seconds`` (default: the
    ``dedupe_window`` of the settings) before the batch's receipt is a duplicate; so is a repeat inside these
    batches. Calls about a user suppressed for the source (or for ``*``) are dropped and counted.
    """
    if window_seconds is None:
        window_seconds = get_settings().dedupe_window()
    window = timedelta(seconds=window_seconds)
    by_source: dict[str, list[int]] = {}
    for position, batch in enumerate(batches):
        by_source.setdefault(batch.source.name, []).append(position)
    results: list[IngestResult | None] = [None] * len(batches)
    for source, positions in by_source.items():
        for position, result in zip(
            positions, _commit_source(connection, source, [batches[p] for p in positions], window), strict=True
        ):
            results[position] = result
    return results  # type: ignore[return-value]


def ingest_batch(
    raw_messages: Sequence[Any], source: SourceInfo, *, engine: Engine | None = None, **batch_fields: Any
) -> IngestResult:
    """Ingest one batch of calls from ``source`` and commit it (one transaction) before returning.

    Args:
        raw_messages: Calls in wire form (dicts).
        source: The source they came from.
        engine: The store (the configured one by default).
        **batch_fields: ``prepare_batch``'s keyword arguments (``context``, ``integrations``, ``sent_at``,
            ``received_at``, ``oversize``, ``first_index``).

    Raises:
        EnvelopeError: the batch is refused as a whole.
    """
    prepared = prepare_batch(raw_messages, source, **batch_fields)
    with (engine or get_engine()).begin() as connection:
        return commit_batches(connection, [prepared])[0]
